"""The training loop's frozen heap is released when the loop ends, also when it raises."""

import gc

import pytest

from ardea.trainer.frozen_heap import frozen_heap


def test_objects_are_frozen_inside_and_released_after():
    assert gc.get_freeze_count() == 0
    with frozen_heap():
        assert gc.get_freeze_count() > 1000  # at least the modules imported by the test run
    assert gc.get_freeze_count() == 0


def test_released_when_the_block_raises():
    with pytest.raises(RuntimeError, match="boom"), frozen_heap():
        raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0

"""DAPO's soft overlong penalty, by hand."""

import pytest

from ardea.reward import overlong_penalty


def test_overlong_penalty_by_hand():
    # L_max 10, buffer 4: free up to 6 tokens, then -c * (L - 6) / 4
    lengths = [1, 6, 7, 8, 10]
    assert overlong_penalty(lengths, max_length=10, buffer=4, penalty=1.0) == pytest.approx(
        [0.0, 0.0, -0.25, -0.5, -1.0]
    )
    assert overlong_penalty([9], max_length=10, buffer=4, penalty=0.4) == pytest.approx([-0.3])


def test_zero_buffer_is_off_and_bad_buffers_are_refused():
    assert overlong_penalty([10, 3], max_length=10, buffer=0) == [0.0, 0.0]
    with pytest.raises(ValueError, match="buffer must be in"):
        overlong_penalty([1], max_length=4, buffer=5)

"""EpochSampler: permutations per epoch and exact continuation from its state."""

import pytest

from ardea.data.sampler import EpochSampler


def test_each_epoch_is_a_permutation():
    sampler = EpochSampler(10, 5, seed=0)
    first = sampler.next_batch() + sampler.next_batch()
    second = sampler.next_batch() + sampler.next_batch()
    assert sorted(first) == list(range(10)) and sorted(second) == list(range(10))
    assert first != second


def test_batches_span_epoch_boundaries():
    sampler = EpochSampler(7, 3, seed=1)
    drawn = [i for _ in range(7) for i in sampler.next_batch()]  # 21 = 3 epochs
    for epoch in range(3):
        assert sorted(drawn[7 * epoch : 7 * (epoch + 1)]) == list(range(7))


def test_state_restores_the_same_future():
    reference = EpochSampler(11, 4, seed=5)
    for _ in range(4):
        reference.next_batch()
    state = reference.state_dict()
    expected = [reference.next_batch() for _ in range(6)]
    resumed = EpochSampler(11, 4, seed=5)
    resumed.load_state_dict(state)
    assert [resumed.next_batch() for _ in range(6)] == expected


def test_state_from_other_data_is_rejected():
    state = EpochSampler(11, 4, seed=5).state_dict()
    with pytest.raises(ValueError, match="dataset or seed changed"):
        EpochSampler(12, 4, seed=5).load_state_dict(state)
    with pytest.raises(ValueError, match="empty dataset"):
        EpochSampler(0, 4, seed=5)

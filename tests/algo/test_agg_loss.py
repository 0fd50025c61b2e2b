"""agg_loss: the modes by hand, micro-batch invariance, empty batches."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ardea.algo import AGG_MODES, Aggregation, agg_counts, agg_loss

LOSS = torch.tensor(
    [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]], dtype=torch.float64
)
MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 5 + 6 + 7 + 8) / 6),
        ("seq-mean-token-sum", (3 + 26) / 2),  # the empty third row is not a sequence
        ("seq-mean-token-mean", (1.5 + 6.5) / 2),
        ("seq-mean-token-sum-norm", (3 + 26) / (2 * 4)),
    ],
)
def test_modes_by_hand(mode, expected):
    assert agg_loss(LOSS, MASK, Aggregation(mode)).item() == pytest.approx(expected)


def test_none_keeps_each_counted_token_and_zeroes_the_rest():
    unreduced = agg_loss(LOSS, MASK, Aggregation("none"))
    expected = [[1.0, 2.0, 0.0, 0.0], [5.0, 6.0, 7.0, 8.0], [0.0, 0.0, 0.0, 0.0]]
    torch.testing.assert_close(unreduced, torch.tensor(expected, dtype=torch.float64))
    assert "none" not in AGG_MODES  # no choice of algo.ppo.loss_agg_mode


def test_global_counts_and_horizon():
    assert agg_loss(LOSS, MASK, Aggregation(tokens=12)).item() == pytest.approx(29 / 12)
    agg = Aggregation("seq-mean-token-sum", seqs=torch.tensor(4))
    assert agg_loss(LOSS, MASK, agg).item() == pytest.approx(29 / 4)
    agg = Aggregation("seq-mean-token-sum-norm", horizon=10)
    assert agg_loss(LOSS, MASK, agg).item() == pytest.approx(29 / 20)
    tokens, seqs = agg_counts(MASK)
    assert (int(tokens), int(seqs)) == (6, 2)


def test_empty_batches_give_zero_without_nan():
    for mode in AGG_MODES:
        for loss, mask in ((torch.zeros(0, 4), torch.zeros(0, 4)), (LOSS, torch.zeros(3, 4))):
            loss = loss.clone().requires_grad_(True)
            out = agg_loss(loss, mask, Aggregation(mode, tokens=0, seqs=0))
            out.backward()
            assert out.item() == 0.0
            assert bool(torch.isfinite(loss.grad).all())


def test_nan_at_masked_positions_does_not_leak():
    loss = LOSS.clone()
    loss[2] = float("nan")
    loss[0, 3] = float("inf")
    for mode in AGG_MODES:
        agg = Aggregation(mode)
        torch.testing.assert_close(agg_loss(loss, MASK, agg), agg_loss(LOSS, MASK, agg))


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'mean'; choose one of: token-mean"):
        Aggregation("mean")
    with pytest.raises(ValueError, match=r"mask must have shape \(N, S\)"):
        agg_loss(LOSS, MASK[:, :2])
    with pytest.raises(ValueError, match="tokens must be a non-negative count, got -1"):
        Aggregation(tokens=-1)
    with pytest.raises(ValueError, match="horizon"):
        Aggregation("seq-mean-token-sum-norm", horizon=0)


@settings(max_examples=100, deadline=None)
@given(
    mask=st.lists(st.lists(st.booleans(), min_size=5, max_size=5), min_size=1, max_size=8),
    mode=st.sampled_from(AGG_MODES),
    cuts=st.lists(st.integers(0, 8), max_size=4),
    seed=st.integers(0, 2**16),
)
def test_summing_micro_batches_gives_the_whole_batch_loss(mask, mode, cuts, seed):
    mask = torch.tensor(mask)
    loss = torch.randn(
        mask.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    tokens, seqs = agg_counts(mask)
    whole = agg_loss(loss, mask, Aggregation(mode))
    bounds = sorted({0, mask.shape[0], *(min(c, mask.shape[0]) for c in cuts)})
    agg = Aggregation(mode, tokens, seqs, horizon=5)
    parts = [agg_loss(loss[a:b], mask[a:b], agg) for a, b in zip(bounds[:-1], bounds[1:])]
    parts.append(agg_loss(loss[:0], mask[:0], agg))
    torch.testing.assert_close(sum(parts), whole, rtol=1e-12, atol=1e-12)

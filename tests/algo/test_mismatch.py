"""The train-inference mismatch metrics, by hand."""

import math

import pytest
import torch

from ardea.algo import Aggregation, correction_weights, mismatch_metrics


def test_by_hand():
    # row 0: d = (ln 3, 0); row 1: d = (-0.1) and one untrained position (ignored)
    logprobs = torch.tensor([[math.log(0.3), -1.0], [-0.5, 7.0]])
    behaviour = torch.tensor([[math.log(0.1), -1.0], [-0.4, 0.0]])
    mask = torch.tensor([[True, True], [True, False]])
    m = {k: float(v) for k, v in mismatch_metrics(logprobs, behaviour, mask).items()}
    ln3 = math.log(3.0)
    assert m["mismatch/abs_diff_mean"] == pytest.approx((ln3 + 0.1) / 3, rel=1e-6)
    assert m["mismatch/abs_diff_max"] == pytest.approx(ln3, rel=1e-6)
    k3 = (3 - 1 - ln3) + 0 + (math.exp(-0.1) - 1 + 0.1)
    assert m["mismatch/kl_k3"] == pytest.approx(k3 / 3, rel=1e-5)
    assert m["mismatch/ratio_mean"] == pytest.approx((3 + 1 + math.exp(-0.1)) / 3, rel=1e-6)
    assert m["mismatch/ratio_outside"] == pytest.approx(1 / 3)  # r = 3 only
    assert m["mismatch/seq_abs_diff_mean"] == pytest.approx((ln3 + 0.1) / 2, rel=1e-6)
    assert m["mismatch/seq_ratio_outside"] == pytest.approx(1 / 2)


def test_global_counts_make_micro_batches_add_up():
    gen = torch.Generator().manual_seed(0)
    lp, beh = torch.randn(4, 5, generator=gen), torch.randn(4, 5, generator=gen)
    mask = torch.rand(4, 5, generator=gen) > 0.3
    whole = mismatch_metrics(lp, beh, mask)
    tokens, seqs = float(mask.sum()), float(mask.any(-1).sum())
    agg = Aggregation("token-mean", tokens, seqs)
    parts = [mismatch_metrics(lp[i : i + 2], beh[i : i + 2], mask[i : i + 2], agg) for i in (0, 2)]
    for name, value in whole.items():
        combined = max(p[name] for p in parts) if name.endswith("_max") else sum(p[name] for p in parts)  # fmt: skip
        torch.testing.assert_close(combined, value)


def test_equal_log_probs_measure_nothing():
    lp = torch.randn(3, 4)
    m = mismatch_metrics(lp, lp.clone(), torch.ones(3, 4, dtype=torch.bool))
    assert float(m.pop("mismatch/ratio_mean")) == 1.0
    assert all(float(v) == 0.0 for v in m.values())


def correction_case():
    """Two rows of trained tokens with per-token d = log pi_prox - log pi_behav of
    (ln 3, ln 0.25) and (ln 1.5, 0); the last position of each row is untrained."""
    d = torch.tensor([[math.log(3.0), math.log(0.25), 5.0], [math.log(1.5), 0.0, 5.0]])
    behaviour = torch.full((2, 3), -1.0)
    mask = torch.tensor([[True, True, False], [True, True, False]])
    return behaviour + d, behaviour, mask


@pytest.mark.parametrize(
    ("mode", "options", "expected"),
    [
        # w per token, capped at 2
        ("token_tis", {"cap": 2.0}, [[2.0, 0.25, 0.0], [1.5, 1.0, 0.0]]),
        # W per sequence: 3 * 0.25 = 0.75 and 1.5 * 1 = 1.5, capped at 1.2
        ("seq_tis", {"cap": 1.2}, [[0.75, 0.75, 0.0], [1.2, 1.2, 0.0]]),
        # w kept inside [0.5, 2]
        ("token_mis", {"low": 0.5, "high": 2.0}, [[0.0, 0.0, 0.0], [1.5, 1.0, 0.0]]),
        # W inside [0.8, 2]: the first sequence (0.75) is masked whole
        ("seq_mis", {"low": 0.8, "high": 2.0}, [[0.0, 0.0, 0.0], [1.5, 1.5, 0.0]]),
    ],
)
def test_correction_weights_by_hand(mode, options, expected):
    proximal, behaviour, mask = correction_case()
    weights = correction_weights(proximal, behaviour, mask, mode=mode, **options)
    torch.testing.assert_close(weights, torch.tensor(expected), rtol=1e-6, atol=1e-6)


def test_an_unknown_mode_is_named():
    with pytest.raises(ValueError, match="'tis'"):
        correction_weights(*correction_case(), mode="tis")

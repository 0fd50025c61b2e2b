"""The train-inference mismatch metrics, by hand."""

import math

import pytest
import torch

from ardea.algo import mismatch_metrics


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
    parts = [mismatch_metrics(lp[i : i + 2], beh[i : i + 2], mask[i : i + 2],
                              global_tokens=tokens, global_seqs=seqs) for i in (0, 2)]  # fmt: skip
    for name, value in whole.items():
        combined = max(p[name] for p in parts) if name.endswith("_max") else sum(p[name] for p in parts)  # fmt: skip
        torch.testing.assert_close(combined, value)


def test_equal_log_probs_measure_nothing():
    lp = torch.randn(3, 4)
    m = mismatch_metrics(lp, lp.clone(), torch.ones(3, 4, dtype=torch.bool))
    assert float(m.pop("mismatch/ratio_mean")) == 1.0
    assert all(float(v) == 0.0 for v in m.values())

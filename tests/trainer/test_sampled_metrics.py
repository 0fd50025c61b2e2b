"""pass@k, avg@n and their standard errors from sampled completions, by hand."""

import math

import pytest

from ardea.trainer.evaluate import pass_at_k, sampled_metrics


def test_pass_at_k_by_hand():
    """n = 4 samples, c right: pass@2 = 1 - C(4-c, 2) / C(4, 2) = 1 - C(4-c, 2) / 6."""
    assert [pass_at_k(4, c, 2) for c in range(5)] == pytest.approx([0, 0.5, 5 / 6, 1, 1])
    assert pass_at_k(4, 1, 1) == 0.25  # pass@1 is c / n
    with pytest.raises(ValueError, match="pass@k needs 0 <= c <= n and 1 <= k <= n"):
        pass_at_k(4, 5, 2)


def test_avg_and_pass_at_k_with_standard_errors_by_hand():
    """Three prompts with 0, 2 and 4 right of 4 samples, k = 2. avg@4: values 0, 0.5, 1,
    mean 0.5, sample std 0.5, se 0.5 / sqrt(3) = 0.2886751. pass@2: values 0, 5/6, 1, mean
    11/18 = 0.6111111, sample variance ((11/18)^2 + (4/18)^2 + (7/18)^2) / 2 = 93/324,
    se sqrt(93 / 324 / 3) = 0.3093202."""
    metrics = sampled_metrics([0, 2, 4], n=4, k=2)
    assert metrics["avg@4"] == pytest.approx(0.5)
    assert metrics["avg@4_se"] == pytest.approx(0.5 / math.sqrt(3))
    assert metrics["pass@2"] == pytest.approx(11 / 18)
    assert metrics["pass@2_se"] == pytest.approx(math.sqrt(93 / 324 / 3))
    assert math.sqrt(93 / 324 / 3) == pytest.approx(0.3093202, abs=1e-7)
    alone = sampled_metrics([3], n=4, k=2)  # one prompt: no spread to estimate
    assert alone == {"avg@4": 0.75, "pass@2": 1.0}

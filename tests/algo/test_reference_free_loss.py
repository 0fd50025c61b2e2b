"""SimPO and ORPO against numbers worked out by hand, with their gradients."""

import math

import pytest
import torch

from ardea.algo import orpo_loss, simpo_loss


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_simpo_by_hand():
    """Pairs (a_w, a_l) = (-1, -2) and (-1.5, -1.2), beta 2, gamma 0.5: z = 1.5 and -1.1,
    l = log(1 + e^-z) = 0.2014133 and 1.3873353, mean 0.7943743; dl/da_w = -beta (1 -
    sigmoid(z)) / 2 per pair, dl/da_l its negative."""
    chosen = torch.tensor([-1.0, -1.5], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([-2.0, -1.2], dtype=torch.float64, requires_grad=True)
    loss, metrics = simpo_loss(chosen, rejected, beta=2.0, gamma=0.5)
    z = [1.5, -1.1]
    assert float(loss.detach()) == pytest.approx(
        sum(math.log1p(math.exp(-x)) for x in z) / 2, abs=1e-12
    )
    assert float(loss.detach()) == pytest.approx(0.7943743, abs=1e-7)
    loss.backward()
    expected = [-2.0 * (1 - sigmoid(x)) / 2 for x in z]
    torch.testing.assert_close(chosen.grad, torch.tensor(expected, dtype=torch.float64))
    torch.testing.assert_close(rejected.grad, -torch.tensor(expected, dtype=torch.float64))
    assert float(metrics["loss/rewards_chosen"]) == pytest.approx((-2.0 - 3.0) / 2)
    assert float(metrics["loss/rewards_margins"]) == pytest.approx((2.0 - 0.6) / 2)
    assert float(metrics["loss/rewards_accuracies"]) == 0.5


def test_orpo_by_hand():
    """p_w = 0.5 (odds 1), p_l = 0.2 (odds 1/4): log odds ratio log 4, log sigmoid(log 4)
    = log 0.8; with nll_w 1.3 and lam 0.1, l = 1.3 - 0.1 log 0.8 = 1.3223144. d log odds /
    da = 1 / (1 - p): dl/da_w = -lam (1 - 0.8) * 2 = -0.04, dl/da_l = lam * 0.2 * 1.25 =
    0.025, dl/dnll = 1; divided by global_pairs = 2 (the step's other pair elsewhere)."""
    chosen = torch.tensor([math.log(0.5)], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([math.log(0.2)], dtype=torch.float64, requires_grad=True)
    nll = torch.tensor([1.3], dtype=torch.float64, requires_grad=True)
    loss, metrics = orpo_loss(chosen, rejected, nll, lam=0.1, global_pairs=2)
    assert float(loss.detach()) == pytest.approx((1.3 - 0.1 * math.log(0.8)) / 2, abs=1e-12)
    loss.backward()
    assert float(chosen.grad) == pytest.approx(-0.04 / 2, abs=1e-12)
    assert float(rejected.grad) == pytest.approx(0.025 / 2, abs=1e-12)
    assert float(nll.grad) == pytest.approx(0.5, abs=1e-12)
    assert float(metrics["loss/log_odds_chosen"]) == pytest.approx(math.log(4) / 2)
    assert float(metrics["loss/log_odds_ratio"]) == pytest.approx(math.log(0.8) / 2)
    assert float(metrics["loss/nll"]) == pytest.approx(1.3 / 2)
    assert float(metrics["loss/rewards_accuracies"]) == 0.5  # 1 of the step's 2 pairs


def test_bad_input_is_named():
    x = torch.tensor([-1.0])
    with pytest.raises(ValueError, match="beta must be a positive number"):
        simpo_loss(x, x, beta=0.0)
    with pytest.raises(ValueError, match="lam must be a positive number"):
        orpo_loss(x, x, x, lam=-1.0)
    with pytest.raises(ValueError, match="must have shape"):
        orpo_loss(x, torch.tensor([-1.0, -2.0]), x)
    with pytest.raises(ValueError, match="only finite"):
        simpo_loss(torch.tensor([float("nan")]), x)

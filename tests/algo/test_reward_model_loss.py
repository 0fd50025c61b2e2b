"""The Bradley–Terry loss of a reward model, by hand."""

import math

import pytest
import torch

from ardea.algo import bradley_terry_loss

CHOSEN = torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)
REJECTED = torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64)


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def test_loss_and_metrics_by_hand():
    loss, metrics = bradley_terry_loss(CHOSEN, REJECTED)
    # differences 1, -1, 0: -log sigmoid(d) = log(1 + e^-d)
    assert loss.item() == pytest.approx((softplus(-1) + softplus(1) + math.log(2)) / 3)
    assert float(metrics["loss/bt"]) == pytest.approx(loss.item())
    assert float(metrics["loss/accuracy"]) == pytest.approx(1 / 3)  # the tie counts as wrong
    assert float(metrics["loss/score_margin"]) == pytest.approx(0.0)
    assert float(metrics["loss/score_chosen"]) == pytest.approx(1.5 / 3)
    assert float(metrics["loss/score_rejected"]) == pytest.approx(1.5 / 3)


def test_margin_and_centring_by_hand():
    loss, metrics = bradley_terry_loss(CHOSEN, REJECTED, margin=0.5, center_coef=0.1)
    bt = softplus(-0.5) + softplus(1.5) + softplus(0.5)  # d - m = 0.5, -1.5, -0.5
    centre = 0.1 * (3.0**2 + 1.0**2 + 1.0**2)  # (r_w + r_l)^2 = 9, 1, 1
    assert loss.item() == pytest.approx((bt + centre) / 3)
    assert float(metrics["loss/bt"]) == pytest.approx(bt / 3)


def test_gradients_by_hand_and_micro_batches_add_up():
    chosen = CHOSEN.clone().requires_grad_(True)
    rejected = REJECTED.clone().requires_grad_(True)
    loss, _ = bradley_terry_loss(chosen, rejected, center_coef=0.1)
    loss.backward()
    d = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)
    s = torch.tensor([3.0, -1.0, 1.0], dtype=torch.float64)
    # dl/dr_w = -sigmoid(-d) + 2 c (r_w + r_l); dl/dr_l = sigmoid(-d) + 2 c (r_w + r_l)
    torch.testing.assert_close(chosen.grad, (-torch.sigmoid(-d) + 0.2 * s) / 3)
    torch.testing.assert_close(rejected.grad, (torch.sigmoid(-d) + 0.2 * s) / 3)
    parts = [
        bradley_terry_loss(CHOSEN[s], REJECTED[s], center_coef=0.1, global_pairs=3)[0]
        for s in (slice(0, 1), slice(1, 3))
    ]
    torch.testing.assert_close(sum(parts), loss.detach())
    empty, _ = bradley_terry_loss(CHOSEN[:0], REJECTED[:0], global_pairs=3)
    assert empty.item() == 0.0


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="shape"):
        bradley_terry_loss(CHOSEN, REJECTED[:2])
    with pytest.raises(ValueError, match="finite"):
        bradley_terry_loss(CHOSEN, torch.full((3,), float("nan"), dtype=torch.float64))
    with pytest.raises(ValueError, match="center_coef"):
        bradley_terry_loss(CHOSEN, REJECTED, center_coef=-1.0)
    with pytest.raises(ValueError, match="margin"):
        bradley_terry_loss(CHOSEN, REJECTED, margin=float("inf"))

"""DPO and IPO losses."""

import math

import pytest
import torch
import torch.nn.functional as F

from ardea.algo import PairLogps, dpo_loss, ipo_loss

PC = torch.tensor([-5.0, -3.0, -8.0], dtype=torch.float64)
PR = torch.tensor([-6.0, -2.0, -8.5], dtype=torch.float64)
RC = torch.tensor([-5.5, -3.0, -7.0], dtype=torch.float64)
RR = torch.tensor([-5.5, -2.5, -9.0], dtype=torch.float64)


def test_dpo_matches_the_seed_formula_and_by_hand():
    loss, metrics = dpo_loss(PairLogps(PC, PR, RC, RR), beta=0.1)
    seed = -F.logsigmoid(0.1 * ((PC - PR) - (RC - RR))).mean()  # seed 002
    torch.testing.assert_close(loss, seed, rtol=0, atol=0)
    # h = (1 - 0) = 1, (-1 + 0.5) = -0.5, (0.5 - 2) = -1.5
    by_hand = sum(math.log1p(math.exp(-0.1 * h)) for h in (1.0, -0.5, -1.5)) / 3
    assert loss.item() == pytest.approx(by_hand)
    assert float(metrics["loss/reward_chosen"]) == pytest.approx(0.1 * (0.5 + 0.0 - 1.0) / 3)
    assert float(metrics["loss/reward_accuracy"]) == pytest.approx(1 / 3)
    assert float(metrics["loss/reward_margin"]) == pytest.approx(0.1 * (1.0 - 0.5 - 1.5) / 3)


def test_ipo_by_hand():
    loss, metrics = ipo_loss(PairLogps(PC, PR, RC, RR), beta=0.5)
    assert loss.item() == pytest.approx(sum((h - 1.0) ** 2 for h in (1.0, -0.5, -1.5)) / 3)
    assert "loss/ipo" in metrics


def test_gradients_and_micro_batch_normalization():
    pc = PC.clone().requires_grad_(True)
    loss, _ = dpo_loss(PairLogps(pc, PR, RC, RR), beta=0.1)
    loss.backward()
    h = torch.tensor([1.0, -0.5, -1.5], dtype=torch.float64)
    torch.testing.assert_close(pc.grad, -0.1 * torch.sigmoid(-0.1 * h) / 3)
    parts = [
        dpo_loss(PairLogps(PC[s], PR[s], RC[s], RR[s], global_pairs=3))[0]
        for s in (slice(0, 1), slice(1, 3))
    ]
    torch.testing.assert_close(sum(parts), loss.detach())
    empty, _ = dpo_loss(PairLogps(PC[:0], PR[:0], RC[:0], RR[:0], global_pairs=3))
    assert empty.item() == 0.0


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(PairLogps(PC, PR, RC, RR), beta=0.0)
    with pytest.raises(ValueError, match="shape"):
        ipo_loss(PairLogps(PC, PR[:2], RC, RR))
    with pytest.raises(ValueError, match="finite"):
        dpo_loss(PairLogps(PC, PR, RC, torch.full((3,), float("nan"), dtype=torch.float64)))

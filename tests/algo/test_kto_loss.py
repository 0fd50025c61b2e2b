"""KTO's loss and reference point against numbers worked out by hand (Ethayarajh et al.
2024, eq. 8; TRL's KTO loss)."""

import pytest
import torch

from ardea.algo import kto_kl_estimate, kto_logratio_sum, kto_loss

# three examples: r = policy - reference = 0.5, -1.0, 0.0; labels D, U, D; z = 0.2,
# beta 0.5, w_D 1, w_U 2:
#   D: 1 - sigmoid(0.5 * (0.5 - 0.2)) = 1 - sigmoid(0.15)  = 0.4625701547
#   U: 2 * (1 - sigmoid(0.5 * (0.2 + 1.0))) = 2 * (1 - sigmoid(0.6)) = 0.7086873875
#   D: 1 - sigmoid(0.5 * (0.0 - 0.2)) = 1 - sigmoid(-0.1) = 0.5249791875
# loss = 1.6962367297 / 3; d loss / d r = -w beta s (1 - s) / 3 (D), +w beta s (1 - s) / 3 (U)
POLICY = [-2.0, -3.0, -1.5]
REFERENCE = [-2.5, -2.0, -1.5]
LABELS = [True, False, True]


def _loss(**kwargs):
    policy = torch.tensor(POLICY, dtype=torch.float64, requires_grad=True)
    kwargs = {"beta": 0.5, "desirable_weight": 1.0, "undesirable_weight": 2.0} | kwargs
    loss, metrics = kto_loss(
        policy, torch.tensor(REFERENCE, dtype=torch.float64), torch.tensor(LABELS),
        torch.tensor(0.2, dtype=torch.float64), **kwargs,
    )  # fmt: skip
    return policy, loss, metrics


def test_loss_and_gradient_by_hand():
    policy, loss, metrics = _loss()
    assert loss.item() == pytest.approx(0.5654122432, abs=1e-9)
    loss.backward()
    want = [-0.0414331678, 0.0762614135, -0.0415626734]
    assert policy.grad.tolist() == pytest.approx(want, abs=1e-9)
    assert metrics["loss/kto"].item() == pytest.approx(0.5654122432, abs=1e-9)
    # rewards beta * r: chosen (0.25 + 0) / 2, rejected -0.5 / 1
    assert metrics["loss/rewards_chosen"].item() == pytest.approx(0.125)
    assert metrics["loss/rewards_rejected"].item() == pytest.approx(-0.5)
    assert metrics["loss/rewards_margins"].item() == pytest.approx(0.625)
    assert metrics["loss/logps_chosen"].item() == pytest.approx(-1.75)
    assert metrics["loss/logps_rejected"].item() == pytest.approx(-3.0)


def test_global_counts_divide_the_sums():
    """As one micro-batch of a step of 6 examples (4 desirable): the same sums over 6 / 4 / 2."""
    _, loss, metrics = _loss(global_examples=6, global_desirable=4, global_undesirable=2)
    assert loss.item() == pytest.approx(1.6962367297 / 6, abs=1e-9)
    assert metrics["loss/rewards_chosen"].item() == pytest.approx(0.25 / 4)
    assert metrics["loss/rewards_rejected"].item() == pytest.approx(-0.5 / 2)


def test_reference_point_is_a_clamped_detached_mean():
    policy = torch.tensor([-1.0, -2.0], requires_grad=True)
    total = kto_logratio_sum(policy, torch.tensor([-1.5, -2.1]))  # 0.5 + 0.1
    assert total.item() == pytest.approx(0.6) and not total.requires_grad
    z = kto_kl_estimate(total, 2)
    assert z.item() == pytest.approx(0.3) and not z.requires_grad
    negative = kto_logratio_sum(torch.tensor([-2.0]), torch.tensor([-1.0]))
    assert kto_kl_estimate(negative, 1).item() == 0.0
    assert kto_kl_estimate(kto_logratio_sum(torch.zeros(0), torch.zeros(0)), 0).item() == 0.0


def test_reference_point_of_several_batches_is_the_mean_of_all_their_pairs():
    """Two batches (micro-batches, or ranks): log-ratios (0.5, 0.1) and (-0.2): the mean of the
    three, 0.4 / 3, not the mean of the two batch means (0.3 and -0.2 -> 0.05)."""
    first = kto_logratio_sum(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.1]))
    second = kto_logratio_sum(torch.tensor([-3.0]), torch.tensor([-2.8]))
    assert kto_kl_estimate(first + second, 3).item() == pytest.approx(0.4 / 3)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="beta must be a positive number"):
        _loss(beta=0.0)
    with pytest.raises(ValueError, match="undesirable_weight must be a positive number"):
        _loss(undesirable_weight=-1.0)
    with pytest.raises(ValueError, match="desirable must be a bool tensor"):
        kto_loss(torch.zeros(2), torch.zeros(2), torch.ones(2), torch.tensor(0.0))
    with pytest.raises(ValueError, match="kl must be a 0-d tensor"):
        kto_loss(torch.zeros(2), torch.zeros(2), torch.ones(2, dtype=torch.bool), torch.zeros(1))

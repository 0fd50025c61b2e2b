"""Clipped value loss and explained variance."""

import pytest
import torch

from ardea.algo import explained_variance, value_loss


def test_clipped_value_loss_by_hand():
    values = torch.tensor([[1.0, 0.0, 0.5]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0]])
    returns = torch.tensor([[0.5, 1.0, -1.0]])
    loss, metrics = value_loss(values, old, returns, torch.ones(1, 3), value_eps_clip=0.2)
    # token 0: max(0.25, (0.2-0.5)^2=0.09)=0.25; token 1: 1.0 both; token 2: max(2.25, 1.44)=2.25
    assert loss.item() == pytest.approx(0.5 * (0.25 + 1.0 + 2.25) / 3)
    assert float(metrics["loss/value_clip_frac"]) == 0.0
    loss2, metrics2 = value_loss(
        values, old, torch.tensor([[1.5, 1.0, 1.0]]), torch.ones(1, 3), value_eps_clip=0.2
    )
    # token 0: max(0.25, 1.69); token 1: 1.0; token 2: max(0.25, 0.64)
    assert loss2.item() == pytest.approx(0.5 * (1.69 + 1.0 + 0.64) / 3)
    assert float(metrics2["loss/value_clip_frac"]) == pytest.approx(2 / 3)


def test_unclipped_is_half_the_seed_squared_error():
    # seed 001's strategy: ((values - returns)^2 * mask).sum() / mask.sum().clamp(min=1)
    gen = torch.Generator().manual_seed(0)
    values, returns = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
    mask = torch.rand(3, 5, generator=gen) > 0.4
    seed = ((values - returns) ** 2 * mask).sum() / mask.sum().clamp(min=1)
    loss, _ = value_loss(values, values, returns, mask, value_eps_clip=None)
    torch.testing.assert_close(2 * loss, seed)


def test_zero_critic_and_zero_returns_give_zero_loss_and_empty_mask_no_nan():
    loss, _ = value_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3))
    assert loss.item() == 0.0
    values = torch.randn(2, 3, requires_grad=True)
    loss, metrics = value_loss(values, torch.zeros(2, 3), torch.randn(2, 3), torch.zeros(2, 3))
    loss.backward()
    assert loss.item() == 0.0 and bool(torch.isfinite(values.grad).all())


def test_explained_variance_matches_the_seed_formula():
    gen = torch.Generator().manual_seed(1)
    values, returns = torch.randn(2, 6, generator=gen), torch.randn(2, 6, generator=gen)
    mask = torch.rand(2, 6, generator=gen) > 0.3
    m = mask.float()
    count = m.sum().clamp(min=1)

    def var(x):
        mean = (x * m).sum() / count
        return ((x - mean) ** 2 * m).sum() / count

    expected = 1.0 - var(values - returns) / var(returns).clamp(min=1e-8)
    torch.testing.assert_close(explained_variance(values, returns, mask), expected)
    assert float(explained_variance(returns, returns, mask)) == pytest.approx(1.0)
    assert float(explained_variance(values, returns, torch.zeros(2, 6))) == 0.0


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="returns must have shape"):
        value_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="value_eps_clip"):
        value_loss(
            torch.zeros(2, 3),
            torch.zeros(2, 3),
            torch.zeros(2, 3),
            torch.ones(2, 3),
            value_eps_clip=-1.0,
        )
    with pytest.raises(ValueError, match="finite"):
        value_loss(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.full((1, 1), float("nan")), torch.ones(1, 1)
        )

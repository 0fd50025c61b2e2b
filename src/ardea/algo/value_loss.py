"""Critic losses: clipped value regression and explained variance.

Reference: the PPO value-clipping trick of OpenAI baselines (``ppo2``), as used by
cleanRL and verl: the new value may move at most ``value_eps_clip`` away from the value
recorded at rollout time before the clipped error takes over::

    v_clip = old_values + clip(values - old_values, -eps, eps)
    l      = 0.5 * max((values - returns)^2, (v_clip - returns)^2)

``value_eps_clip=None`` gives the plain ``0.5 * (values - returns)^2``. The 0.5 factor
follows those references (the seed's PPO strategy has no 0.5; scale ``vf_coef`` to match).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ardea.algo._checks import as_mask, check_finite, check_float, check_shape
from ardea.algo.agg import TOKEN_MEAN, Aggregation, agg_loss, masked_mean


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    loss_mask: Tensor,
    *,
    value_eps_clip: float | None = 0.2,
    agg: Aggregation = TOKEN_MEAN,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss (module docstring formula), aggregated by :func:`agg_loss` as
    ``agg`` says.

    Args:
        values: ``(N, S)`` critic output (with gradient), next-token aligned.
        old_values: ``(N, S)`` critic values recorded when the advantages were computed.
        returns: ``(N, S)`` regression targets (from :func:`compute_advantages`).
        loss_mask: ``(N, S)`` bool or 0/1.
        value_eps_clip: clip range > 0, or None for no clipping.

    Returns:
        ``(loss, metrics)`` with ``loss/value`` and ``loss/value_clip_frac`` (fraction of
        tokens where the clipped error is the larger one), token means over ``agg.tokens``.
    """
    for name, x in (("values", values), ("old_values", old_values), ("returns", returns)):
        check_float(name, x)
        check_shape(name, x, values.shape, "(N, S)")
    m = as_mask("loss_mask", loss_mask, values.shape, "(N, S)")
    for name, x in (("values", values), ("old_values", old_values), ("returns", returns)):
        check_finite(name, x.detach(), where=m)
    returns, old_values = returns.detach(), old_values.detach()
    error = (values - returns).square()  # (N, S)
    clip_active = torch.zeros_like(m)
    if value_eps_clip is not None:
        if not (math.isfinite(value_eps_clip) and value_eps_clip > 0):
            raise ValueError(f"value_eps_clip must be a positive number, got {value_eps_clip}")
        v_clip = old_values + (values - old_values).clamp(-value_eps_clip, value_eps_clip)
        clipped_error = (v_clip - returns).square()
        clip_active = clipped_error > error
        error = torch.maximum(error, clipped_error)
    loss = agg_loss(0.5 * error, m, agg)
    metrics = {
        "loss/value": loss.detach(),
        "loss/value_clip_frac": masked_mean(clip_active.to(values.dtype), m, agg.tokens),
    }
    return loss, metrics


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """``1 - Var[returns - values] / Var[returns]`` over masked tokens, 0-d detached.

    Population variances over the counted tokens of ``(N, S)`` inputs; 1 means the critic
    predicts the returns exactly, 0 means no better than their mean. ``Var[returns]`` is
    clamped at 1e-8; no counted token gives 0.
    """
    check_float("values", values)
    check_shape("returns", returns, values.shape, "(N, S)")
    m = as_mask("mask", mask, values.shape, "(N, S)")
    if not bool(m.any()):
        return values.new_zeros(())

    def var(x: Tensor) -> Tensor:
        x = x.detach()
        mean = masked_mean(x, m)
        return masked_mean((x - mean).square(), m)

    return 1.0 - var(returns - values) / var(returns).clamp(min=1e-8)

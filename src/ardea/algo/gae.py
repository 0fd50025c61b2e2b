"""Generalized advantage estimation at token, turn and response level.

Reference: Schulman et al., "High-Dimensional Continuous Control Using Generalized
Advantage Estimation" (2016), eq. 16: ``A_t = sum_l (gamma*lambda)^l delta_{t+l}`` with
``delta_t = r_t + gamma * V_{t+1} - V_t``, computed backwards as
``A_t = delta_t + gamma * lambda * A_{t+1}``.

All three entry points run the same recurrence (:mod:`ardea.algo._gae_scan`); they differ
in what one time step is:

- :func:`compute_token_level_gae` -- one step per trained token of a next-token-aligned
  ``(B, T)`` batch. Tokens whose ``loss_mask`` is 0 (prompt, tool output, padding) are not
  steps: the running value and advantage pass through them unchanged, so a tool-output gap
  costs no discount. The last column is the bootstrap slot. Bit-identical to the legacy
  recurrence of the PPO actor in the seed documents.
- :func:`compute_turn_level_gae` -- one step per assistant turn (multi-turn agents): a
  turn's reward is the sum of its token rewards, its value the value at its first trained
  token, and its advantage is broadcast back to all of its tokens.
- :func:`compute_gae` -- response-layout ``(..., R)`` tensors with no bootstrap: the
  episode ends after the last valid token, padded positions get 0.

``gae_lambda`` is a float or one value per trajectory (a ``(B,)`` tensor, e.g. from the
length-adaptive functions in :mod:`ardea.algo.lambda_fn`). Nothing here is differentiable.

Deviation from the seed's response-level function: a mask with interior holes is read like
the token level (the hole is skipped, not an episode end); right-padded masks, the only
layout the seed uses, give identical numbers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ardea.algo._checks import (
    as_mask,
    check_finite,
    check_float,
    check_ndim,
    check_number,
    check_shape,
    check_tensor,
    per_row,
)
from ardea.algo._ckernel import c_kernel_available, turn_slots_c
from ardea.algo._gae_scan import gae_scan


def _check_lambda(gae_lambda: float | Tensor) -> None:
    if isinstance(gae_lambda, Tensor):
        if bool(((gae_lambda < 0) | (gae_lambda > 1)).any()):
            raise ValueError("gae_lambda must lie in [0, 1]; got values outside it")
    elif not 0.0 <= check_number("gae_lambda", gae_lambda) <= 1.0:
        raise ValueError(f"gae_lambda must lie in [0, 1], got {gae_lambda}")


def _discount_coef(discount: float, gae_lambda: float | Tensor, like: Tensor) -> Tensor:
    """Per-row ``gamma * lambda`` (B,), rounded exactly as the legacy recurrence rounds it."""
    rows = like.shape[0]
    if isinstance(gae_lambda, Tensor):
        lam = per_row("gae_lambda", gae_lambda, rows, "(B,)", dtype=like.dtype, device=like.device)
        _check_lambda(lam)
        return discount * lam  # tensor op: gamma is cast to the dtype first
    _check_lambda(gae_lambda)
    return torch.full((rows,), discount * float(gae_lambda), dtype=like.dtype, device=like.device)


def _check_common(
    rewards: Tensor, values: Tensor, seq_no_eos_mask: Tensor, bootstrap_values: Tensor, discount
) -> tuple[Tensor, Tensor, float]:
    check_float("rewards", rewards)
    check_ndim("rewards", rewards, 2, "(B, T)")
    check_float("values", values)
    check_shape("values", values, rewards.shape, "(B, T)")
    if values.dtype != rewards.dtype:
        raise TypeError(f"values dtype {values.dtype} must match rewards dtype {rewards.dtype}")
    check_finite("rewards", rewards)
    check_finite("values", values)
    rows = rewards.shape[0]
    no_eos = as_mask("seq_no_eos_mask", seq_no_eos_mask, (rows,), "(B,)")
    check_float("bootstrap_values", bootstrap_values)
    check_shape("bootstrap_values", bootstrap_values, (rows,), "(B,)")
    check_finite("bootstrap_values", bootstrap_values)
    gamma = check_number("discount", discount, low=0.0)
    next_values = bootstrap_values.to(rewards.dtype) * no_eos  # (B,) 0 where the row ended
    return no_eos, next_values, gamma


def compute_token_level_gae(
    *,
    rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    seq_no_eos_mask: Tensor,
    bootstrap_values: Tensor,
    discount: float,
    gae_lambda: float | Tensor,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """Token-level GAE over next-token-aligned ``(B, T)`` tensors.

    For ``t = T-2 .. 0`` (column ``T-1`` is the bootstrap slot, its advantage is 0)::

        delta_t = r_t + gamma * V_next - V_t
        A_t     = delta_t + gamma * lambda_b * A_next      if loss_mask[b, t]
        A_t     = A_next, V_next unchanged                 otherwise

    where ``V_next`` and ``A_next`` belong to the next trained position, and start as
    ``bootstrap_values * seq_no_eos_mask`` and 0. ``returns = advantages + values``
    everywhere (masked positions hold the carried advantage, as in the legacy loop).

    Args:
        rewards: ``(B, T)`` float per-token rewards (outcome and KL penalty).
        values: ``(B, T)`` critic values, same dtype as ``rewards``.
        loss_mask: ``(B, T)`` bool or 0/1, 1 on trained (generated) positions.
        seq_no_eos_mask: ``(B,)`` bool, True where the trajectory was truncated.
        bootstrap_values: ``(B,)`` value of the state after the last token.
        discount: ``gamma >= 0``.
        gae_lambda: float in [0, 1] or ``(B,)`` tensor (one lambda per trajectory).
        backend: ``"auto"``, ``"c"`` or ``"torch"`` (same numbers; see ``_gae_scan``).

    Returns:
        ``(advantages, returns)``, both ``(B, T)`` in the dtype of ``rewards``.
    """
    check_tensor("rewards", rewards)
    _, next_values, gamma = _check_common(
        rewards, values, seq_no_eos_mask, bootstrap_values, discount
    )
    mask = as_mask("loss_mask", loss_mask, rewards.shape, "(B, T)")
    coef = _discount_coef(gamma, gae_lambda, rewards)
    advantages = gae_scan(rewards, values, mask, next_values, coef, gamma, backend=backend)
    return advantages, advantages + values


_TURN_ID_ERRORS = {
    1: "turn_ids at trained positions (loss_mask=1) must be non-negative",
    2: "turn_ids at trained positions must be smaller than the sequence length T={length}",
    3: "turn_ids at trained positions must be temporally nondecreasing in each row",
}


def _check_turn_id_dtype(turn_ids: Tensor, active: Tensor) -> None:
    check_tensor("turn_ids", turn_ids)
    if turn_ids.dtype == torch.bool or turn_ids.is_floating_point() or turn_ids.is_complex():
        raise ValueError(f"turn_ids must have an integer dtype, got {turn_ids.dtype}")
    check_shape("turn_ids", turn_ids, active.shape, "(B, T)")


def check_turn_ids(turn_ids: Tensor, active: Tensor) -> None:
    """Validate ``(B, T)`` integer ``turn_ids`` at ``active`` positions.

    Raises ``ValueError`` for a non-integer dtype and ``RuntimeError`` when an active id is
    negative, not smaller than the sequence length ``T``, or smaller than an earlier active
    id of the same row (ids must be temporally nondecreasing).
    """
    _check_turn_id_dtype(turn_ids, active)
    ids, length = turn_ids.long(), active.shape[-1]
    if bool((active & (ids < 0)).any()):
        raise RuntimeError(_TURN_ID_ERRORS[1])
    if bool((active & (ids >= length)).any()):
        raise RuntimeError(_TURN_ID_ERRORS[2].format(length=length))
    if length > 1:
        running_max = torch.where(active, ids, -1).cummax(dim=-1).values  # (B, T)
        if bool((active[:, 1:] & (ids[:, 1:] < running_max[:, :-1])).any()):
            raise RuntimeError(_TURN_ID_ERRORS[3])


def _turn_slots(
    rewards: Tensor, values: Tensor, active: Tensor, turn_ids: Tensor, backend: str
) -> tuple[Tensor, Tensor, Tensor]:
    """Validate turn ids; gather per-turn reward sums, first-token values and presence.

    Slot ``k`` of the ``(B, T + 1)`` outputs belongs to turn id ``k``; slot ``T`` is spare.
    """
    if backend != "torch" and c_kernel_available(rewards.dtype):
        error, turn_rewards, turn_values, present = turn_slots_c(rewards, values, active, turn_ids)
        if error:
            raise RuntimeError(_TURN_ID_ERRORS[error].format(length=rewards.shape[-1]))
        return turn_rewards, turn_values, present
    check_turn_ids(turn_ids, active)
    ids = turn_ids.long()
    rows, length = rewards.shape
    slot = torch.where(active, ids, length)  # (B, T) inactive tokens go to the spare slot T
    turn_rewards = torch.zeros(rows, length + 1, dtype=rewards.dtype, device=rewards.device)
    turn_rewards.scatter_add_(1, slot, torch.where(active, rewards, 0.0))
    positions = torch.arange(length, device=rewards.device).expand(rows, length)
    first = torch.full((rows, length + 1), length - 1, dtype=torch.long, device=rewards.device)
    first.scatter_reduce_(1, slot, positions, reduce="amin", include_self=True)
    present = torch.zeros(rows, length + 1, dtype=torch.bool, device=rewards.device)
    present.scatter_(1, slot, active)
    present[:, length] = False
    turn_values = torch.where(present, values.gather(1, first), 0.0)  # (B, T + 1)
    return turn_rewards, turn_values, present


def compute_turn_level_gae(
    *,
    rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    turn_ids: Tensor,
    seq_no_eos_mask: Tensor,
    bootstrap_values: Tensor,
    discount: float,
    gae_lambda: float | Tensor,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """Turn-level GAE: one recursion step per assistant turn, broadcast to its tokens.

    With ``k`` running over the turns present in a row (ids need not be contiguous: a gap
    or an unused id costs no step)::

        R_k = sum of rewards[t] over trained tokens t of turn k
        V_k = values[first trained token of turn k]
        delta_k = R_k + gamma * V_{k+1} - V_k          V_{K} = bootstrap * seq_no_eos
        A_k = delta_k + gamma * lambda_b * A_{k+1}

    Every trained token of turn ``k`` gets ``advantages = A_k`` and
    ``returns = A_k + V_k``; other positions get advantage 0 and return ``values``.

    Args:
        rewards: ``(B, T)`` float, next-token aligned.
        values: ``(B, T)`` float, next-token aligned.
        loss_mask: ``(B, T)`` bool or 0/1, 1 on trained tokens.
        turn_ids: ``(B, T)`` integer turn index of each trained token (other positions may
            hold anything, conventionally -1).
        seq_no_eos_mask: ``(B,)`` bool, True where the trajectory was truncated.
        bootstrap_values: ``(B,)`` value after the last token.
        discount: ``gamma >= 0``.
        gae_lambda: float in [0, 1] or ``(B,)`` tensor.

    Returns:
        ``(advantages, returns)``, both ``(B, T)``.

    Raises:
        ValueError: ``turn_ids`` has a non-integer dtype (or any shape/dtype problem).
        RuntimeError: an active turn id is negative, ``>= T`` or decreases in time.
    """
    check_tensor("rewards", rewards)
    _, next_values, gamma = _check_common(
        rewards, values, seq_no_eos_mask, bootstrap_values, discount
    )
    active = as_mask("loss_mask", loss_mask, rewards.shape, "(B, T)")
    _check_turn_id_dtype(turn_ids, active)
    turn_rewards, turn_values, present = _turn_slots(rewards, values, active, turn_ids, backend)
    coef = _discount_coef(gamma, gae_lambda, rewards)
    turn_adv = gae_scan(
        turn_rewards, turn_values, present, next_values, coef, gamma, backend=backend
    )  # (B, T + 1), one entry per turn id
    slot = torch.where(active, turn_ids.long(), rewards.shape[1])  # untrained -> spare slot T
    advantages = turn_adv.gather(1, slot)  # the spare (bootstrap) slot's advantage is 0
    returns = torch.where(active, (turn_adv + turn_values).gather(1, slot), values)
    return advantages, returns


def _check_response(rewards: Tensor, values: Tensor, mask: Tensor, gamma) -> tuple[Tensor, float]:
    check_float("rewards", rewards)
    if rewards.dim() < 1:
        raise ValueError("rewards must have shape (..., R), got a scalar")
    check_float("values", values)
    check_shape("values", values, rewards.shape, "(..., R)")
    valid = as_mask("mask", mask, rewards.shape, "(..., R)")
    check_finite("rewards", rewards)
    check_finite("values", values)
    return valid, check_number("gamma", gamma, low=0.0)


def compute_gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float,
    gae_lambda: float | Tensor,
    *,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """GAE over response-layout tensors ``(..., R)``, e.g. ``(B, G, R)``; no bootstrap.

    ``V`` is zeroed where ``mask`` is 0, and the value after the last valid token is 0
    (the response ended)::

        A_t = delta_t + gamma * lambda * A_{t+1},   delta_t = r_t + gamma * V_{t+1} - V_t

    over valid positions; padded positions get ``advantages = returns = 0`` and their
    rewards and values never leak into valid ones. ``returns = advantages + V``.

    Args:
        rewards: ``(..., R)`` float; the terminal reward sits at the last valid position.
        values: ``(..., R)`` float, ``V(s_t)`` before response token ``t``.
        mask: ``(..., R)`` bool or 0/1, 1 on valid response tokens.
        gamma: discount ``>= 0``.
        gae_lambda: float in [0, 1] or a tensor of shape ``rewards.shape[:-1]``.

    Returns:
        ``(advantages, returns)`` with the shape of ``rewards``.
    """
    valid, gamma = _check_response(rewards, values, mask, gamma)
    length = rewards.shape[-1]
    flat_valid = valid.reshape(-1, length)
    rows = flat_valid.shape[0]
    flat_values = torch.where(flat_valid, values.reshape(-1, length), 0.0).to(rewards.dtype)
    flat_rewards = rewards.reshape(-1, length)
    if isinstance(gae_lambda, Tensor):
        check_shape("gae_lambda", gae_lambda, rewards.shape[:-1], "(...)")
        gae_lambda = gae_lambda.reshape(rows)

    def pad(x: Tensor, fill) -> Tensor:  # append the (empty) bootstrap slot
        return torch.cat([x, torch.full((rows, 1), fill, dtype=x.dtype, device=x.device)], 1)

    coef = _discount_coef(gamma, gae_lambda, flat_rewards)
    zero = torch.zeros(rows, dtype=rewards.dtype, device=rewards.device)
    adv = gae_scan(
        pad(flat_rewards, 0.0),
        pad(flat_values, 0.0),
        pad(flat_valid, False),
        zero,
        coef,
        gamma,
        backend=backend,
    )[:, :length]
    adv = torch.where(flat_valid, adv, 0.0)
    returns = adv + flat_values
    return adv.reshape(rewards.shape), returns.reshape(rewards.shape)

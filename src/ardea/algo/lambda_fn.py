"""GAE lambda functions: one lambda per trajectory, from its length.

A lambda function takes a context of ``(N,)`` int64 tensors and keyword arguments and
returns one lambda per trajectory, an ``(N,)`` float tensor::

    fn(context, **kwargs) -> Tensor (N,)

Context keys (computed on the next-token-aligned ``loss_mask``, see
:func:`build_lambda_context`):

- ``effective_token_lengths``: trained tokens per trajectory;
- ``turn_counts``: distinct assistant turns among them;
- ``timestep_lengths``: the GAE time steps per trajectory -- tokens when
  ``gae_timestep_unit='token'``, turns when ``'turn'``.

References: VAPO (Yue et al. 2025, "VAPO: Efficient and Reliable Reinforcement Learning for
Advanced Reasoning Tasks", length-adaptive GAE: ``lambda = 1 - 1 / (alpha * L)``);
:func:`relative_position_gae_lambda` makes the first step of every trajectory retain the
same fraction ``q`` of a terminal reward whatever its length. Deviation from VAPO: lambda is
clipped at 0 for ``alpha * L < 1`` and is 0 for empty trajectories.

A config's ``gae_lambda`` names a function by dotted path, e.g.
``ardea.algo.lambda_fn.vapo_length_adaptive_gae``, resolved by :func:`resolve_gae_lambda_fn`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from ardea.algo._checks import as_mask, check_tensor
from ardea.errors import ConfigError
from ardea.registry import import_dotted

LambdaFn = Callable[..., Tensor]
CONTEXT_KEYS = ("effective_token_lengths", "turn_counts", "timestep_lengths")
TIMESTEP_UNITS = ("token", "turn")


def constant_gae_lambda(context: Mapping[str, Tensor], *, value: float) -> Tensor:
    """The same lambda for every trajectory: ``lambda_i = value``, shape ``(N,)`` float32."""
    lengths = context["timestep_lengths"]
    return torch.full(lengths.shape, float(value), dtype=torch.float32, device=lengths.device)


def vapo_length_adaptive_gae(context: Mapping[str, Tensor], *, alpha: float = 0.05) -> Tensor:
    """VAPO's length-adaptive lambda: ``lambda_i = max(0, 1 - 1 / (alpha * L_i))``.

    ``L_i`` is ``context['timestep_lengths']`` (N,); ``lambda_i = 0`` where ``L_i = 0``.
    Longer trajectories get a lambda closer to 1 (less bias over the long horizon).

    Returns:
        ``(N,)`` float32.

    Raises:
        ValueError: ``alpha`` is not a positive finite number.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ValueError(f"alpha must be a positive number, got {alpha!r}")
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a positive number, got {alpha!r}")
    lengths = context["timestep_lengths"].to(torch.float32)
    lam = (1.0 - 1.0 / (alpha * lengths)).clamp(min=0.0)
    return torch.where(lengths > 0, lam, 0.0)


def relative_position_gae_lambda(context: Mapping[str, Tensor], *, q: float) -> Tensor:
    """Lambda that decays a terminal reward to ``q`` at the first step of every trajectory.

    ``lambda_i = q ** (1 / (L_i - 1))`` for ``L_i >= 2`` time steps, so that
    ``lambda_i ** (L_i - 1) = q`` and equal endpoint-normalized positions keep equal shares;
    ``lambda_i = 1`` for ``L_i = 1`` (nothing to decay) and 0 for ``L_i = 0``.

    Returns:
        ``(N,)`` float32 (computed in float64).

    Raises:
        ValueError: ``q`` is not a finite number in (0, 1].
    """
    if isinstance(q, bool) or not isinstance(q, (int, float)):
        raise ValueError(f"q must be a finite number in (0, 1], got {q!r}")
    if not (math.isfinite(q) and 0.0 < q <= 1.0):
        raise ValueError(f"q must be a finite number in (0, 1], got {q!r}")
    lengths = context["timestep_lengths"].to(torch.float64)
    steps = (lengths - 1.0).clamp(min=1.0)
    lam = torch.pow(torch.full_like(lengths, float(q)), 1.0 / steps)
    lam = torch.where(lengths == 1, 1.0, lam)
    return torch.where(lengths > 0, lam, 0.0).to(torch.float32)


def _import_dotted(path: str) -> LambdaFn:
    fn = import_dotted(path, f"gae_lambda={path!r}")
    if not callable(fn):
        raise ConfigError(f"gae_lambda={path!r} is a {type(fn).__name__}, not a function")
    return fn


def resolve_gae_lambda_fn(spec: float | int | str | LambdaFn) -> tuple[LambdaFn, bool]:
    """Turn a config's ``gae_lambda`` into ``(fn, is_custom)``.

    A number (or a string holding one) gives ``constant_gae_lambda`` bound to it and
    ``is_custom=False`` (the static fast path; ``gae_lambda_kwargs`` are ignored). A dotted
    path ``package.module.function`` imports that function and gives ``is_custom=True``;
    so does a callable passed directly (programmatic use).

    Raises:
        ValueError: a bool, a non-finite or out-of-[0, 1] number, or an unresolvable path.
    """
    if isinstance(spec, bool):
        raise ValueError(f"gae_lambda must be a number or a dotted path, got bool {spec}")
    if callable(spec):
        return spec, True
    if isinstance(spec, str):
        try:
            spec = float(spec)
        except ValueError:
            return _import_dotted(spec.strip()), True
    if not isinstance(spec, (int, float)):
        raise ValueError(f"gae_lambda must be a number or a dotted path, got {spec!r}")
    value = float(spec)
    if not math.isfinite(value):
        raise ValueError(f"Static gae_lambda must be finite, got {value}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"Static gae_lambda must lie in [0, 1], got {value}")
    return functools.partial(constant_gae_lambda, value=value), False


def count_turns(active: Tensor, turn_ids: Tensor) -> Tensor:
    """Distinct turn ids among ``active`` positions per row: ``(N, S) -> (N,)`` int64."""
    sentinel = torch.iinfo(torch.int64).max
    ids = torch.where(active, turn_ids.long(), sentinel).sort(dim=-1).values  # (N, S)
    new = ids[:, :1] != sentinel
    if ids.shape[-1] > 1:
        new = torch.cat([new, (ids[:, 1:] != ids[:, :-1]) & (ids[:, 1:] != sentinel)], dim=-1)
    return new.sum(dim=-1)


def build_lambda_context(
    loss_mask: Tensor, turn_ids: Tensor | None = None, timestep_unit: str = "token"
) -> dict[str, Tensor]:
    """The per-trajectory lengths a lambda function sees.

    Args:
        loss_mask: ``(N, S)`` next-token-aligned, bool or 0/1.
        turn_ids: ``(N, S)`` integer, same alignment; without it each non-empty trajectory
            counts as one turn (only allowed in token mode).
        timestep_unit: ``'token'`` or ``'turn'``.

    Returns:
        ``{'effective_token_lengths', 'turn_counts', 'timestep_lengths'}``, each ``(N,)``
        int64.
    """
    if timestep_unit not in TIMESTEP_UNITS:
        raise ValueError(f"gae_timestep_unit must be 'token' or 'turn', got {timestep_unit!r}")
    check_tensor("loss_mask", loss_mask)
    if loss_mask.dim() != 2:
        raise ValueError(f"loss_mask must have shape (N, S), got {tuple(loss_mask.shape)}")
    active = as_mask("loss_mask", loss_mask, loss_mask.shape, "(N, S)")
    tokens = active.sum(dim=-1)  # (N,) int64
    if turn_ids is None:
        if timestep_unit == "turn":
            raise ValueError(
                "gae_timestep_unit='turn' requires rollout data with per-token turn_ids "
                "(batch['turn_ids'])"
            )
        turns = (tokens > 0).long()
    else:
        check_tensor("turn_ids", turn_ids)
        if turn_ids.shape != loss_mask.shape:
            raise ValueError(
                f"turn_ids shape {tuple(turn_ids.shape)} must match loss_mask "
                f"{tuple(loss_mask.shape)}"
            )
        turns = count_turns(active, turn_ids)
    steps = tokens if timestep_unit == "token" else turns
    return {"effective_token_lengths": tokens, "turn_counts": turns, "timestep_lengths": steps}


def compute_gae_lambda(
    loss_mask: Tensor,
    turn_ids: Tensor | None = None,
    *,
    gae_lambda: float | str,
    gae_lambda_kwargs: Mapping[str, Any] | None = None,
    timestep_unit: str = "token",
) -> Tensor:
    """One lambda per trajectory, ``(N,)``, from a config's ``gae_lambda`` spec.

    A number gives ``full((N,), gae_lambda)`` without building any context (kwargs are
    ignored). A dotted path calls ``fn(build_lambda_context(...), **gae_lambda_kwargs)``
    and checks that it returned one finite value in [0, 1] per local trajectory.
    """
    fn, is_custom = resolve_gae_lambda_fn(gae_lambda)
    if not is_custom:
        rows = loss_mask.shape[0]
        return torch.full((rows,), float(gae_lambda), dtype=torch.float32, device=loss_mask.device)
    context = build_lambda_context(loss_mask, turn_ids, timestep_unit)
    return check_lambda_output(fn(context, **dict(gae_lambda_kwargs or {})), loss_mask.shape[0])


def check_lambda_output(lam: object, rows: int) -> Tensor:
    """Validate a lambda function's result: ``(rows,)``, finite, in [0, 1]."""
    if not isinstance(lam, Tensor):
        raise ValueError(
            f"a gae_lambda function must return a tensor with one value per local trajectory "
            f"(shape ({rows},)), got {type(lam).__name__}"
        )
    if tuple(lam.shape) != (rows,):
        raise ValueError(
            f"a gae_lambda function must return one value per local trajectory: expected "
            f"shape ({rows},), got {tuple(lam.shape)}"
        )
    lam = lam if lam.is_floating_point() else lam.to(torch.float32)
    if not bool(torch.isfinite(lam).all()) or bool(((lam < 0) | (lam > 1)).any()):
        raise ValueError("a gae_lambda function must return finite values in [0, 1]")
    return lam

"""Aggregate a per-token loss into one number, independently of micro-batching.

One :class:`Aggregation` says how: its ``mode`` and the counts it divides by. With ``m``
the mask, ``l`` the per-token loss, ``T`` the number of counted tokens and ``Q`` the number
of sequences with at least one counted token (both over the *whole* batch, all
micro-batches and ranks, when the aggregation carries them as ``tokens`` / ``seqs``):

=============================  =================================================
mode                           value
=============================  =================================================
``token-mean``                 ``sum_{i,t} m l / T``
``seq-mean-token-sum``         ``sum_i (sum_t m l) / Q``
``seq-mean-token-mean``        ``sum_i (sum_t m l / sum_t m) / Q``
``seq-mean-token-sum-norm``    ``sum_{i,t} m l / (Q * H)``  (Dr. GRPO; ``H`` = horizon)
``none``                       ``m l``, the ``(N, S)`` per-token loss, not reduced
=============================  =================================================

Because every micro-batch divides by the same global counts, summing the aggregated
micro-batch losses gives exactly the whole-batch loss (up to float summation order) --
the gradient-accumulation bug class where each micro-batch takes its own token mean is
excluded. Without global counts, the local counts of this call are used. A zero count
never divides: an empty batch or an all-zero mask gives a loss of 0 (still attached to the
graph of ``loss``), never NaN. Masked positions are selected out, so NaN or inf there
cannot leak. ``none`` is for a caller that reports each token's loss and sums them itself
(the Tinker API server: its loss is the plain sum over tokens); it is no choice of
``algo.ppo.loss_agg_mode`` (:data:`AGG_MODES`).

Reference for ``seq-mean-token-sum-norm``: Liu et al. 2025, "Understanding R1-Zero-Like
Training: A Critical Perspective" (Dr. GRPO), which divides by a constant generation budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ardea.algo._checks import as_mask, check_float

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
UNREDUCED = "none"

Count = int | float | Tensor | None


@dataclass(frozen=True)
class Aggregation:
    """How :func:`agg_loss` reduces a per-token loss: ``mode`` (the module table) and the
    whole batch's ``tokens`` (``T``), ``seqs`` (``Q``) and ``horizon`` (``H`` of
    ``seq-mean-token-sum-norm``; default ``S``: pass a constant such as the generation budget
    when micro-batches are padded to different lengths). A count left None is the local one
    of each call."""

    mode: str = "token-mean"
    tokens: Count = None
    seqs: Count = None
    horizon: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in (*AGG_MODES, UNREDUCED):
            raise ValueError(
                f"unknown loss_agg_mode {self.mode!r}; choose one of: {', '.join(AGG_MODES)}"
            )
        for name in ("tokens", "seqs"):
            value = getattr(self, name)
            if isinstance(value, bool) or (not isinstance(value, Tensor | None) and value < 0):
                raise ValueError(f"{name} must be a non-negative count, got {value!r}")
        if self.horizon is not None and (isinstance(self.horizon, bool) or self.horizon <= 0):
            raise ValueError(f"horizon must be a positive number of tokens, got {self.horizon!r}")


TOKEN_MEAN = Aggregation()


def agg_counts(mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(tokens, seqs)`` counted by ``mask (N, S)``: 0-d int64 tensors to sum across
    micro-batches (and all-reduce across ranks) into an :class:`Aggregation`'s counts."""
    m = mask.bool()
    return m.sum(), m.any(dim=-1).sum()


def _count(value: Count, local: Tensor, like: Tensor) -> Tensor:
    count = local if value is None else value.detach() if isinstance(value, Tensor) else value
    return torch.as_tensor(count).to(dtype=like.dtype, device=like.device).clamp(min=1.0)


def agg_loss(loss: Tensor, mask: Tensor, agg: Aggregation = TOKEN_MEAN) -> Tensor:
    """Aggregate ``loss (N, S)`` over ``mask (N, S)`` as ``agg`` says (the module table).

    Args:
        loss: ``(N, S)`` float per-token loss.
        mask: ``(N, S)`` bool or 0/1, 1 where the token counts.
        agg: the mode and the whole batch's counts (default: the token mean of this call).

    Returns:
        0-d tensor; ``(N, S)`` for the mode ``none``.
    """
    check_float("loss", loss)
    if loss.dim() != 2:
        raise ValueError(f"loss must have shape (N, S), got {tuple(loss.shape)}")
    m = as_mask("mask", mask, loss.shape, "(N, S)")
    masked = torch.where(m, loss, 0.0)  # (N, S)
    if agg.mode == UNREDUCED:
        return masked
    local_tokens, local_seqs = agg_counts(m)
    if agg.mode == "token-mean":
        return masked.sum() / _count(agg.tokens, local_tokens, loss)
    seqs = _count(agg.seqs, local_seqs, loss)
    per_seq = masked.sum(dim=-1)  # (N,)
    if agg.mode == "seq-mean-token-sum":
        return per_seq.sum() / seqs
    if agg.mode == "seq-mean-token-mean":
        lengths = m.sum(dim=-1).clamp(min=1).to(loss.dtype)
        return (per_seq / lengths).sum() / seqs
    steps = loss.shape[-1] if agg.horizon is None else agg.horizon
    if steps <= 0:
        raise ValueError(f"seq-mean-token-sum-norm needs a horizon > 0, got {steps}")
    return per_seq.sum() / (seqs * steps)


def masked_mean(x: Tensor, mask: Tensor, tokens: Count = None) -> Tensor:
    """``sum(mask * x) / T`` (the ``token-mean`` of ``x`` over ``tokens``, default this
    ``mask``'s), detached, for metrics."""
    return agg_loss(x.detach(), mask, Aggregation("token-mean", tokens))

"""Aggregate a per-token loss into one number, independently of micro-batching.

With ``m`` the mask, ``l`` the per-token loss, ``T`` the number of counted tokens and ``Q``
the number of sequences with at least one counted token (both over the *whole* batch,
all micro-batches and ranks, when supplied as ``global_tokens`` / ``global_seqs``):

=============================  =================================================
mode                           value
=============================  =================================================
``token-mean``                 ``sum_{i,t} m l / T``
``seq-mean-token-sum``         ``sum_i (sum_t m l) / Q``
``seq-mean-token-mean``        ``sum_i (sum_t m l / sum_t m) / Q``
``seq-mean-token-sum-norm``    ``sum_{i,t} m l / (Q * H)``  (Dr. GRPO; ``H`` = horizon)
=============================  =================================================

Because every micro-batch divides by the same global counts, summing the aggregated
micro-batch losses gives exactly the whole-batch loss (up to float summation order) --
the gradient-accumulation bug class where each micro-batch takes its own token mean is
excluded. Without global counts, the local counts of this call are used. A zero count
never divides: an empty batch or an all-zero mask gives a loss of 0 (still attached to the
graph of ``loss``), never NaN. Masked positions are selected out, so NaN or inf there
cannot leak.

Reference for ``seq-mean-token-sum-norm``: Liu et al. 2025, "Understanding R1-Zero-Like
Training: A Critical Perspective" (Dr. GRPO), which divides by a constant generation budget.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ardea.algo._checks import as_mask, check_float

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_counts(mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(tokens, seqs)`` counted by ``mask (N, S)``: 0-d int64 tensors to sum across
    micro-batches (and all-reduce across ranks) into ``global_tokens`` / ``global_seqs``."""
    m = mask.bool()
    return m.sum(), m.any(dim=-1).sum()


def _count(value: int | float | Tensor | None, local: Tensor, name: str, like: Tensor) -> Tensor:
    if value is None:
        count = local
    elif isinstance(value, Tensor):
        count = value.detach()
    else:
        if isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative count, got {value!r}")
        count = torch.tensor(value)
    return count.to(dtype=like.dtype, device=like.device).clamp(min=1.0)


def agg_loss(
    loss: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    global_tokens: int | Tensor | None = None,
    global_seqs: int | Tensor | None = None,
    horizon: int | None = None,
) -> Tensor:
    """Aggregate ``loss (N, S)`` over ``mask (N, S)`` by ``mode`` (see the module table).

    Args:
        loss: ``(N, S)`` float per-token loss.
        mask: ``(N, S)`` bool or 0/1, 1 where the token counts.
        mode: one of ``AGG_MODES``.
        global_tokens: ``T``, counted tokens over the whole batch (default: this ``mask``).
        global_seqs: ``Q``, sequences with a counted token over the whole batch.
        horizon: ``H`` for ``seq-mean-token-sum-norm`` (default ``S``; pass a constant such
            as the generation budget when micro-batches are padded to different lengths).

    Returns:
        0-d tensor.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of: {', '.join(AGG_MODES)}")
    check_float("loss", loss)
    if loss.dim() != 2:
        raise ValueError(f"loss must have shape (N, S), got {tuple(loss.shape)}")
    m = as_mask("mask", mask, loss.shape, "(N, S)")
    masked = torch.where(m, loss, 0.0)  # (N, S)
    local_tokens, local_seqs = agg_counts(m)
    if mode == "token-mean":
        return masked.sum() / _count(global_tokens, local_tokens, "global_tokens", loss)
    seqs = _count(global_seqs, local_seqs, "global_seqs", loss)
    per_seq = masked.sum(dim=-1)  # (N,)
    if mode == "seq-mean-token-sum":
        return per_seq.sum() / seqs
    if mode == "seq-mean-token-mean":
        lengths = m.sum(dim=-1).clamp(min=1).to(loss.dtype)
        return (per_seq / lengths).sum() / seqs
    steps = loss.shape[-1] if horizon is None else horizon
    if isinstance(steps, bool) or steps <= 0:
        raise ValueError(f"horizon must be a positive number of tokens, got {horizon!r}")
    return per_seq.sum() / (seqs * steps)


def masked_mean(x: Tensor, mask: Tensor, *, global_tokens: int | Tensor | None = None) -> Tensor:
    """``sum(mask * x) / T`` (the ``token-mean`` of ``x``), detached, for metrics."""
    return agg_loss(x.detach(), mask, "token-mean", global_tokens=global_tokens)

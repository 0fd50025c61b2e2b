"""Masked next-token cross-entropy (supervised fine-tuning, pretraining).

``l_t = -log softmax(logits_t)[target_t]`` (optionally label-smoothed) on counted
positions, aggregated by :func:`ardea.algo.agg.agg_loss` as an :class:`~ardea.algo.agg.Aggregation` says. ``logits[:, t]`` must already be
aligned with ``targets[:, t]`` (for a causal LM: ``targets = input_ids[:, 1:]`` against
``logits[:, :-1]``, or the pipeline's ``next_token_align``). Logits are upcast to float32.
For memory, prefer computing token log-probs in chunks in the model layer and aggregating
``-logprobs`` with :func:`agg_loss`; both give the same loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ardea.algo._checks import as_mask, check_float, check_shape, check_tensor
from ardea.algo.agg import TOKEN_MEAN, Aggregation, agg_loss


def masked_cross_entropy(
    logits: Tensor,
    targets: Tensor,
    loss_mask: Tensor,
    *,
    label_smoothing: float = 0.0,
    agg: Aggregation = TOKEN_MEAN,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Cross-entropy of ``logits (N, S, V)`` against ``targets (N, S)`` on ``loss_mask``.

    Targets at uncounted positions may hold anything (e.g. padding or -100).

    Returns:
        ``(loss, {"loss/ce": loss})``.
    """
    check_float("logits", logits)
    if logits.dim() != 3:
        raise ValueError(f"logits must have shape (N, S, V), got {tuple(logits.shape)}")
    check_tensor("targets", targets)
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise TypeError(f"targets must hold integer token ids, got dtype {targets.dtype}")
    check_shape("targets", targets, logits.shape[:2], "(N, S)")
    m = as_mask("loss_mask", loss_mask, logits.shape[:2], "(N, S)")
    vocab = logits.shape[-1]
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must lie in [0, 1), got {label_smoothing}")
    counted = targets[m]
    if counted.numel() and bool(((counted < 0) | (counted >= vocab)).any()):
        raise ValueError(f"targets at counted positions must lie in [0, V={vocab})")
    safe_targets = torch.where(m, targets.long(), 0)
    per_token = F.cross_entropy(
        logits.float().flatten(0, 1),
        safe_targets.flatten(),
        reduction="none",
        label_smoothing=label_smoothing,
    ).view(m.shape)  # (N, S)
    loss = agg_loss(per_token, m, agg)
    return loss, {"loss/ce": loss.detach()}

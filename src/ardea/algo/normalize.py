"""Group and batch statistics for scores and advantages, with groups of any size.

A group is the set of trajectories answering one prompt (``group_ids (N,)``, any integer
labels, groups may differ in size). Standard deviations are population (``unbiased=False``)
standard deviations, as in the GRPO formula of the seed documents: ``(x - mean) / (std + eps)``.
Normalizations never divide by zero: an empty set of tokens or a constant group gives 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ardea.algo._checks import as_mask, check_float, check_shape, check_tensor

NORM_EPS = 1e-8
NORM_MODES = ("none", "batch", "group")


def group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary group labels ``(N,)`` to dense indices ``0..K-1``; return ``(index, K)``."""
    check_tensor("group_ids", group_ids)
    if group_ids.dim() != 1:
        raise ValueError(f"group_ids must have shape (N,), got {tuple(group_ids.shape)}")
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise TypeError(f"group_ids must have an integer dtype, got {group_ids.dtype}")
    uniq, index = torch.unique(group_ids, return_inverse=True)
    return index, uniq.numel()


def group_stats(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-trajectory statistics of its group.

    Args:
        scores: ``(N,)`` float.
        group_ids: ``(N,)`` integer group label of each trajectory.

    Returns:
        ``(mean, std, size)``, each ``(N,)``: the group's mean, population std
        ``sqrt(sum (x - mean)^2 / n)`` and member count ``n``, gathered back per trajectory.
    """
    check_float("scores", scores)
    check_shape("group_ids", group_ids, scores.shape, "(N,)")
    index, groups = group_index(group_ids)
    zeros = torch.zeros(groups, dtype=scores.dtype, device=scores.device)
    size = zeros.index_add(0, index, torch.ones_like(scores))  # (K,)
    mean = zeros.index_add(0, index, scores) / size
    centered = scores - mean[index]
    var = zeros.index_add(0, index, centered.square()) / size
    return mean[index], var.sqrt()[index], size[index]


def groups_with_spread(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """``(N,)`` bool: rows whose group's rewards are not all equal (max > min, exactly: a
    population std can be a rounding error above 0 for a constant group)."""
    index, groups = group_index(group_ids)
    x = rewards.float()
    high = torch.full((groups,), -torch.inf, device=x.device).scatter_reduce(0, index, x, "amax")
    low = torch.full((groups,), torch.inf, device=x.device).scatter_reduce(0, index, x, "amin")
    return (high > low)[index]


def normalize_scores(
    scores: Tensor, mode: str, group_ids: Tensor | None = None, eps: float = NORM_EPS
) -> Tensor:
    """Normalize per-trajectory scores ``(N,)``: ``(x - mean) / (std + eps)``.

    ``mode``: ``'none'`` (identity), ``'batch'`` (statistics over all ``N``) or ``'group'``
    (statistics over each trajectory's group; needs ``group_ids``).
    """
    if mode not in NORM_MODES:
        raise ValueError(f"unknown normalization {mode!r}; choose one of: {', '.join(NORM_MODES)}")
    check_float("scores", scores)
    if mode == "none" or scores.numel() == 0:
        return scores
    if mode == "batch":
        mean, std = scores.mean(), scores.std(unbiased=False)
    else:
        if group_ids is None:
            raise ValueError("group normalization needs batch['group_ids'] (N,)")
        mean, std, _ = group_stats(scores, group_ids)
    return (scores - mean) / (std + eps)


def masked_whiten(
    x: Tensor, mask: Tensor, group_ids: Tensor | None = None, eps: float = NORM_EPS
) -> Tensor:
    """Whiten ``(N, S)`` values over the positions where ``mask`` is 1.

    ``(x - mean) / (std + eps)`` with mean and population std over all counted tokens of
    the batch, or, when ``group_ids (N,)`` is given, over the counted tokens of each group.
    Positions outside ``mask`` become 0; no counted token gives all zeros.
    """
    check_float("x", x)
    if x.dim() != 2:
        raise ValueError(f"x must have shape (N, S), got {tuple(x.shape)}")
    m = as_mask("mask", mask, x.shape, "(N, S)").to(x.dtype)
    xm = torch.where(m.bool(), x, 0.0)
    if group_ids is None:
        index = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        groups = 1
    else:
        check_shape("group_ids", group_ids, x.shape[:1], "(N,)")
        index, groups = group_index(group_ids)
    zeros = torch.zeros(groups, dtype=x.dtype, device=x.device)
    count = zeros.index_add(0, index, m.sum(-1)).clamp(min=1.0)  # (K,)
    mean = zeros.index_add(0, index, xm.sum(-1)) / count
    centered = (xm - mean[index, None]) * m
    var = zeros.index_add(0, index, centered.square().sum(-1)) / count
    return centered / (var.sqrt()[index, None] + eps)

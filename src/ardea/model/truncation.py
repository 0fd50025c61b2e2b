"""Top-k / top-p truncation of a next-token distribution, shared by the engine that samples
(:mod:`ardea.rollout.engines.inprocess.sampling`) and the trainer that recomputes the log-probs of what was
sampled (:func:`ardea.model.sequence_logprobs` with ``top_k`` / ``top_p``), so the PPO ratio
compares one distribution on both sides.

Notation: ``(N, V)`` logits ``z`` (already divided by the temperature); dropped tokens get
−inf, so ``log_softmax`` of the result is the truncated, renormalised distribution.
"""

from __future__ import annotations

import torch


def top_k_filter(z: torch.Tensor, k: int) -> torch.Tensor:
    """Set every entry below the k-th largest of its row to −inf (ties with it are kept).

    z: (N, V) → (N, V). ``k == 0`` or ``k >= V`` leaves z unchanged.
    """
    if k <= 0 or k >= z.shape[-1]:
        return z
    kth = torch.topk(z, k, dim=-1).values[:, -1:]  # (N, 1)
    return z.masked_fill(z < kth, float("-inf"))


def top_p_filter(z: torch.Tensor, p: float) -> torch.Tensor:
    """Keep, per row, the smallest prefix of tokens sorted by probability whose mass reaches p.

    A token at sorted position i is kept iff the mass strictly before it, Σ_{j<i} softmax(z)_j,
    is < p, so the most likely token is always kept. z: (N, V) → (N, V), −inf where dropped.
    ``p >= 1`` leaves z unchanged.
    """
    if p >= 1.0:
        return z
    sorted_z, order = torch.sort(z, dim=-1, descending=True)  # (N, V)
    probs = torch.softmax(sorted_z, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # (N, V)
    drop_sorted = mass_before >= p
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
    return z.masked_fill(drop, float("-inf"))


def truncate(z: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """``z`` restricted to its top-k set, then to the top-p set of what is left."""
    return top_p_filter(top_k_filter(z, top_k), top_p)

"""A step's rollout → optimizer updates, and each rank's share of them.

:func:`split_updates` cuts the whole rollout into ``epochs × mini_batches`` updates of
``micro_batches`` micro-batches, groups kept whole. Under torchrun every rank holds the whole
rollout (the rollout service hands it to each, :mod:`ardea.rollout.service`) and
splits it the same way, with the same generator; :func:`shard_updates` then gives each rank
its share of every micro-batch's groups, in the order of their ids. Groups are found by id,
never by adjacency: an agent rollout's rows arrive in the order its episodes finished, so the
rows of one group need not be next to each other. So a mini-batch holds the same groups at
every world size (the update is the one-process update), and every rank runs exactly as many
forwards as the others: a rank whose share of a micro-batch is empty (an online DPO step with
fewer pairs than ranks) runs a :class:`Filler` — the micro-batch's first group with its loss
multiplied by zero — so it still joins every collective of that forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ardea.data import TrajectoryBatch


@dataclass(frozen=True)
class Filler:
    """A forward that only keeps a rank in step with the others: ``batch`` (real rows, so
    every module runs as usual) contributes nothing — its loss is multiplied by zero and
    neither its counts nor its metrics are added."""

    batch: TrajectoryBatch


def shard_updates(
    updates: list[list[TrajectoryBatch]], rank: int, world_size: int
) -> list[list[TrajectoryBatch | Filler]]:
    """Rank ``rank``'s share of every micro-batch of ``updates`` (each rank's: the rows of
    the groups ``torch.tensor_split(groups, world_size)[rank]``, ``groups`` the micro-batch's
    distinct group ids in increasing order; rows in batch order), a :class:`Filler` where
    that share is empty. ``world_size`` 1 returns ``updates`` as they are."""
    if world_size == 1:
        return updates
    out = []
    for micro_batches in updates:
        shares: list[TrajectoryBatch | Filler] = []
        for batch in micro_batches:
            groups = torch.unique(batch.group_ids)  # (K,) each group once, wherever its rows are
            mine = torch.tensor_split(groups, world_size)[rank]
            if mine.numel():
                shares.append(batch.select(_rows_of(batch.group_ids, mine)).trim())
            else:
                shares.append(Filler(batch.select(_rows_of(batch.group_ids, groups[:1])).trim()))
        out.append(shares)
    return out


def split_updates(
    batch: TrajectoryBatch,
    *,
    epochs: int,
    mini_batches: int,
    micro_batches: int,
    generator: torch.Generator,
    by_length: bool = True,
) -> list[list[TrajectoryBatch]]:
    """``epochs × mini_batches`` optimizer updates over the groups of ``batch``, each a list
    of ``micro_batches`` micro-batches (trimmed of padding columns), a micro-batch whose
    rows differ much in length run as a few forwards of similar lengths
    (:func:`length_buckets`; not with ``by_length=False``, e.g. under torchrun, where
    every rank must run the same number of forwards).

    Groups stay whole (a preference pair is a group of two) and a part keeps its rows in
    batch order; the groups are shuffled with ``generator`` at every epoch unless there is
    exactly one update (then the rollout's own order is kept). Empty parts are left out; a
    batch without rows gives no update.
    """
    if batch.rows == 0:
        return []
    _, group_of_row = torch.unique(batch.group_ids.cpu(), return_inverse=True)  # (N,)
    groups = int(group_of_row.max()) + 1
    lengths = batch.attention_mask.sum(dim=-1).cpu()  # (N,) real tokens per row
    group_length = torch.zeros(groups, dtype=lengths.dtype).scatter_reduce(
        0, group_of_row, lengths, reduce="amax"
    )  # (groups,) longest row of each group
    group_rows = torch.bincount(group_of_row, minlength=groups)  # (groups,)
    shuffle = epochs > 1 or mini_batches > 1
    updates = []
    for _ in range(epochs):
        order = torch.randperm(groups, generator=generator) if shuffle else torch.arange(groups)
        for mini in order.tensor_split(mini_batches):
            parts = [c for c in mini.tensor_split(micro_batches) if c.numel()]
            forwards = [
                bucket
                for c in parts
                for bucket in (
                    length_buckets(c, group_length[c], group_rows[c]) if by_length else [c]
                )
            ]
            if forwards:
                updates.append([batch.select(_rows_of(group_of_row, c)).trim() for c in forwards])
    return updates


MIN_SAVED_TOKENS = 512
MIN_SAVED_FRACTION = 0.25
"""A micro-batch is split into length buckets only where that saves at least
``MIN_SAVED_TOKENS`` padded token positions and ``MIN_SAVED_FRACTION`` of them: below, the
extra forward's fixed cost on a small model outweighs the saving."""


def length_buckets(groups: torch.Tensor, length: torch.Tensor, rows: torch.Tensor) -> list:
    """``groups`` of one micro-batch → lists of groups, each run as one forward.

    The cost of a forward is its padded size, ``rows × longest row``. Completions that end
    at their EOS after a few tokens next to one that runs to ``max_new_tokens`` make one
    forward mostly padding; the groups (kept whole) sorted by their longest row are cut in
    two where that saves the most, recursively, while a cut saves at least
    :data:`MIN_SAVED_TOKENS` positions and :data:`MIN_SAVED_FRACTION` of them. The loss is unchanged: every
    micro-batch is normalised by the step's global counts. Returns ``[groups]`` when no cut
    pays.

    Args:
        groups: ``(K,)`` group indices. length: ``(K,)`` longest row of each group.
        rows: ``(K,)`` rows of each group.
    """
    order = torch.argsort(length, stable=True)
    groups, length, rows = groups[order], length[order].tolist(), rows[order].tolist()
    cost = sum(rows) * max(length)
    best, cut, above = cost, None, 0
    below = sum(rows)
    for k in range(len(groups) - 1, 0, -1):  # cut before sorted group k
        above += rows[k]
        below -= rows[k]
        split = below * length[k - 1] + above * length[-1]
        if split < best:
            best, cut = split, k
    if cut is None or cost - best < max(MIN_SAVED_TOKENS, MIN_SAVED_FRACTION * cost):
        return [groups] if groups.numel() else []
    lower = length_buckets(groups[:cut], torch.tensor(length[:cut]), torch.tensor(rows[:cut]))
    upper = length_buckets(groups[cut:], torch.tensor(length[cut:]), torch.tensor(rows[cut:]))
    return lower + upper


def _rows_of(group_of_row: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """The rows whose group is one of ``groups``, in batch order."""
    return torch.nonzero(torch.isin(group_of_row, groups)).squeeze(-1)

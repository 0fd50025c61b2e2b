"""Work on a rollout's rows, split over the ranks of a torchrun job: every row once.

Pinning a rollout (the reference's and a teacher's log-probs, the proximal policy's, the
critic's values) is a forward per row that reads that row alone. Every rank holds the whole
rollout, so instead of every rank scoring all ``N`` rows (``W`` times the work of one
process), :meth:`RowShards.map` has rank ``r`` score its contiguous share
``rows[r·⌈N/W⌉ : (r+1)·⌈N/W⌉]`` and all-gathers the shares: each rank gets the ``(N, ...)``
result, equal to one process's up to float32 rounding of the smaller batch's products.

A rank with no rows (``N < W``) scores the first row and drops it, so that it still takes
part in every collective of the forward (FSDP2's all-gathers). With one process,
:meth:`~RowShards.map` is the call itself.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from ardea.data import TrajectoryBatch

Scores = TypeVar("Scores")


@dataclasses.dataclass(frozen=True)
class RowShards:
    """This rank's place among ``world_size`` ranks that split a batch's rows (module
    docstring); ``RowShards()`` is one process."""

    rank: int = 0
    world_size: int = 1

    def share(self, rows: int) -> range:
        """This rank's rows of a batch of ``rows`` (empty past the last row)."""
        size = math.ceil(rows / self.world_size)
        return range(min(self.rank * size, rows), min((self.rank + 1) * size, rows))

    def map(self, batch: TrajectoryBatch, score: Callable[[TrajectoryBatch], Scores]) -> Scores:
        """``score(batch)``, each rank scoring its share of the rows and all ranks gathering
        them (module docstring). ``score`` returns one ``(rows, ...)`` tensor, or a dataclass
        (:class:`~ardea.model.LogprobOutput`) whose ``(rows, S, ...)`` tensors are gathered
        and whose other fields become None (a batch-wide MoE aux loss, router logits: what
        pinning never reads); every row of its result depends on that row alone."""
        if self.world_size == 1:
            return score(batch)
        mine = self.share(batch.rows)
        rows = list(mine) or [0]  # no rows: score one, keep none (module docstring)
        index = torch.tensor(rows, device=batch.input_ids.device)
        part = score(batch.select(index))
        width = math.ceil(batch.rows / self.world_size)
        if isinstance(part, Tensor):
            return _gather(part, len(mine), width, batch.rows)
        fields = {}
        for f in dataclasses.fields(part):
            value = getattr(part, f.name)
            per_row = isinstance(value, Tensor) and value.dim() >= 2  # (rows, S, ...)
            fields[f.name] = _gather(value, len(mine), width, batch.rows) if per_row else None
        return dataclasses.replace(part, **fields)


def _gather(part: Tensor, kept: int, width: int, rows: int) -> Tensor:
    """Every rank's first ``kept`` rows of ``part``, each share padded to ``width`` rows
    for the collective, concatenated in rank order and cut to ``rows``: only the last
    non-empty share can be short, so the padding all lies past row ``rows``."""
    padded = part.new_zeros((width, *part.shape[1:]))
    padded[:kept] = part[:kept]
    shares = [torch.empty_like(padded) for _ in range(dist.get_world_size())]
    dist.all_gather(shares, padded.contiguous())
    return torch.cat(shares)[:rows]


#: one process: :meth:`RowShards.map` is the call itself
ONE_PROCESS = RowShards()

"""DAPO's dynamic sampling (Yu et al. 2025, section 3.2): the RL step's filter and refill.

Groups whose rewards are all equal carry no gradient under group baselines, so they are
dropped (:func:`keep_spread`); the step then refills its batch with the groups of fresh
prompts, drawn from the training set by a sampler of its own whose position is saved with
the run, for at most ``algo.dynamic_sampling_max_rounds`` rounds, and cuts the result to
the step's number of prompts (:func:`first_groups`). A refill round asks for ``k``
batches of ``trainer.batch_size`` prompts,

    k = min(algo.dynamic_sampling_max_refill, ceil(missing groups / (kept share × B))),

with the kept share counted over every group generated so far in the step (``k`` = the cap
when none was kept, :func:`refill_batches`): late in training, when most groups are solved,
one large round replaces many small ones, and batched generation makes it the cheaper way to
a full batch. Metrics: ``rollout/groups_kept`` (fraction of the first round's groups with a
reward spread) and ``rollout/refill_rounds``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ardea.algo import groups_with_spread
from ardea.data import TrajectoryBatch


def group_count(batch: TrajectoryBatch) -> int:
    return int(torch.unique(batch.group_ids).numel())


def keep_spread(batch: TrajectoryBatch) -> TrajectoryBatch:
    """The rows of the groups whose rewards are not all equal, in batch order."""
    spread = groups_with_spread(batch.rewards, batch.group_ids)
    return batch.select(torch.nonzero(spread).squeeze(-1))


def refill_batches(missing: int, *, kept: int, generated: int, batch_size: int, cap: int) -> int:
    """Batches of prompts for the next refill round: ``ceil(missing / (share × B))`` with
    ``share = kept / generated`` groups so far in the step, between 1 and ``cap``."""
    if kept == 0:
        return cap
    return max(1, min(cap, math.ceil(missing * generated / (kept * batch_size))))


def renumber_groups(batch: TrajectoryBatch, start: int) -> TrajectoryBatch:
    """``batch`` (a rollout: group ids from 0) with ``start`` added to its group ids, so
    refilled groups never share an id with the step's earlier groups."""
    return dataclasses.replace(batch, group_ids=batch.group_ids + start)


def first_groups(batch: TrajectoryBatch, wanted: int) -> TrajectoryBatch:
    """The rows of the ``wanted`` groups of lowest id (the step's first prompts: a refill's
    ids follow the rounds before it, :func:`renumber_groups`), in batch order. By id, not by
    position: an agent rollout's rows arrive in the order its episodes finished, so taking
    the first groups seen would keep the quickest episodes and drop the long ones."""
    first = torch.unique(batch.group_ids)[:wanted]
    return batch.select(torch.nonzero(torch.isin(batch.group_ids, first)).squeeze(-1))

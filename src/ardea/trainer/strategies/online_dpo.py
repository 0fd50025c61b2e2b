"""Online DPO: the best and the worst completion of each fresh group as chosen / rejected.

Each micro-batch is a rollout of the live policy (``rollout.group_size`` completions per
prompt, scored by ``reward.functions``); every group whose rewards are not all equal gives
one pair (highest reward chosen, lowest rejected; the first in sampling order on ties) and
the DPO loss of :mod:`ardea.trainer.strategies.dpo` runs on those pairs against the frozen
reference. The pairs keep the rollout's group ids, so mini-batches (split by group) keep
each pair whole. Groups without a reward spread carry no preference and are dropped (counted in
``rollout/pairs``); a step without any pair makes no optimizer step. Epochs, mini-batches
(over pairs), staleness and version publication are those of the RL step
(:mod:`ardea.trainer.step.rl_step`).
"""

from __future__ import annotations

import torch

from ardea.algo import groups_with_spread
from ardea.data import TrajectoryBatch
from ardea.trainer.strategies.base import OnlineStrategy, register_strategy
from ardea.trainer.strategies.dpo import DPOStrategy


def best_worst_pairs(batch: TrajectoryBatch) -> TrajectoryBatch:
    """A rollout → the preference layout (:func:`ardea.data.preference_pairs`): for every
    group whose rewards are not all equal, its highest-reward row (chosen; the first in
    sampling order on ties) and its lowest (rejected)."""
    spread = groups_with_spread(batch.rewards, batch.group_ids)
    chosen, rejected = [], []
    for group in torch.unique(batch.group_ids[spread]).tolist():
        rows = torch.nonzero(batch.group_ids == group).squeeze(-1)  # (G,)
        rewards = batch.rewards[rows]
        chosen.append(rows[int(rewards.argmax())])
        rejected.append(rows[int(rewards.argmin())])
    return batch.select(torch.tensor(chosen + rejected, dtype=torch.long))


@register_strategy("online_dpo")
class OnlineDPOStrategy(OnlineStrategy, DPOStrategy):
    def pin(self, batch: TrajectoryBatch, metrics: dict[str, float]) -> TrajectoryBatch:
        pairs = best_worst_pairs(batch)
        metrics["rollout/pairs"] = float(pairs.rows // 2)
        return pairs

"""Online DPO: the best and the worst completion of each fresh group as chosen / rejected.

Each micro-batch is a rollout of the live policy (``rollout.group_size`` completions per
prompt, scored by ``reward.functions``); every group whose rewards are not all equal gives
one pair (highest reward chosen, lowest rejected; the first in sampling order on ties) and
the DPO loss of :mod:`ardea.trainer.strategies.dpo` runs on those pairs against the frozen
reference. Groups without a reward spread carry no preference and are dropped (counted in
``rollout/pairs``); a step without any pair makes no optimizer step. Epochs, mini-batches
(over pairs), staleness and version publication are those of
:mod:`ardea.trainer.strategies.online`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ardea.data import Example
from ardea.trainer.strategies.base import register_strategy
from ardea.trainer.strategies.dpo import DPOStrategy
from ardea.trainer.strategies.online import OnlineRollouts

PAIR_KEYS = ("input_ids", "attention_mask", "loss_mask")


def best_worst_pairs(batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """Group batch ([N, S] rows with ``rewards`` [N], ``group_ids`` [N]) → preference batch
    (``chosen_*`` / ``rejected_*`` [P, S]) with one pair per group that has a reward spread."""
    chosen, rejected = [], []
    for group in torch.unique(batch["group_ids"]).tolist():
        rows = torch.nonzero(batch["group_ids"] == group).squeeze(-1)  # (G,)
        rewards = batch["rewards"][rows]
        if rewards.max() > rewards.min():
            chosen.append(rows[int(rewards.argmax())])
            rejected.append(rows[int(rewards.argmin())])
    index_c = torch.tensor(chosen, dtype=torch.long)
    index_r = torch.tensor(rejected, dtype=torch.long)
    pairs = {}
    for key in PAIR_KEYS:
        pairs[f"chosen_{key}"] = batch[key][index_c]
        pairs[f"rejected_{key}"] = batch[key][index_r]
    return pairs


@register_strategy("online_dpo")
class OnlineDPOStrategy(OnlineRollouts, DPOStrategy):
    sample_kind = "prompt"

    def __init__(self, policy: nn.Module, config: Any, **kwargs: Any) -> None:
        super().__init__(policy, config, **kwargs)
        self._init_online()

    def collate(self, samples: Sequence[Example]) -> dict[str, Tensor]:
        raise TypeError("online_dpo builds its batches from rollouts (plan_step)")

    def prepare_rollout(
        self, batch: dict[str, Tensor], *, step: int, metrics: dict[str, float]
    ) -> dict[str, Tensor]:
        pairs = best_worst_pairs(batch)
        metrics["rollout/pairs"] = float(len(pairs["chosen_input_ids"]))
        return pairs

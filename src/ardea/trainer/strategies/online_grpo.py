"""Online GRPO: each micro-batch is a fresh rollout of the live policy.

The rollout runner samples ``rollout.group_size`` completions per prompt with the
engine (behaviour log-probs recorded), scores them with the configured rewards, and
the offline GRPO loss of :mod:`ardea.trainer.strategies.grpo` runs on that group batch
with the behaviour log-probs as the ratio's denominator (so no old-policy copy is kept).
After each optimizer step the new weights are published to the engine as the next policy
version; a batch older than ``rollout.max_staleness`` versions is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from ardea.data import Example
from ardea.trainer.strategies.base import register_strategy
from ardea.trainer.strategies.grpo import GRPOStrategy
from ardea.trainer.strategies.online import OnlineRollouts


@register_strategy("online_grpo")
class OnlineGRPOStrategy(OnlineRollouts, GRPOStrategy):
    sample_kind = "prompt"

    def __init__(self, policy: nn.Module, config: Any, **kwargs: Any) -> None:
        super().__init__(policy, config, **kwargs)
        self._init_online()
        self.old_policy = None  # behaviour log-probs come with every rollout

    def collate(self, samples: Sequence[Example]) -> dict[str, Tensor]:
        return self.rollout(samples)

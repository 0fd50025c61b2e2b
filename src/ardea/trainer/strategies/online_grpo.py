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
from ardea.rollout import check_staleness
from ardea.trainer.strategies.base import register_strategy
from ardea.trainer.strategies.grpo import GRPOStrategy


@register_strategy("online_grpo")
class OnlineGRPOStrategy(GRPOStrategy):
    sample_kind = "prompt"

    def __init__(self, policy: nn.Module, config: Any, **kwargs: Any) -> None:
        super().__init__(policy, config, **kwargs)
        if self.runner is None:
            raise ValueError("online_grpo needs a rollout runner (the trainer passes one)")
        self.old_policy = None  # behaviour log-probs come with every rollout
        self._rollout_metrics: list[dict[str, float]] = []
        self._samples: list[tuple[str, str, float]] = []

    def collate(self, samples: Sequence[Example]) -> dict[str, Tensor]:
        batch = self.runner.rollout(samples)
        lag = check_staleness(
            batch["versions"], self.runner.engine.version, self.config.rollout.max_staleness
        )
        self._rollout_metrics.append({**self.runner.last_metrics, "rollout/staleness": lag})
        self._samples.extend(self.runner.last_samples)
        return batch

    def after_optimizer_step(self) -> None:
        """Publish the updated weights (shared with the engine) as the next version."""
        engine = self.runner.engine
        engine.update_weights(None, engine.version + 1)

    def state_dict(self) -> dict[str, Any]:
        """The engine's policy version and the runner's call count (which seeds sampling)."""
        return {"version": self.runner.engine.version, "rollout_calls": self.runner.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["version"] != self.runner.engine.version:
            self.runner.engine.update_weights(None, int(state["version"]))
        self.runner.calls = int(state["rollout_calls"])

    def step_samples(self) -> list[tuple[str, str, float]]:
        samples, self._samples = self._samples, []
        return samples

    def step_metrics(self) -> dict[str, float]:
        collected, self._rollout_metrics = self._rollout_metrics, []
        if not collected:
            return {}
        names = collected[0].keys()
        return {k: sum(m[k] for m in collected) / len(collected) for k in names}

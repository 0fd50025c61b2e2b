"""What every online strategy shares: rollouts from the live policy, version publication,
rollout metrics and samples, and the state a resumed run needs.

Mixed in before an offline strategy (``class OnlineGRPO(OnlineRollouts, GRPOStrategy)``):
the offline strategy supplies the loss; :meth:`OnlineRollouts.rollout` supplies its batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from ardea.data import Example
from ardea.rollout import check_staleness


class OnlineRollouts:
    """Needs ``self.runner`` (a RolloutRunner) and ``self.config`` from the strategy."""

    sample_kind = "prompt"
    runner: Any
    config: Any

    def _init_online(self) -> None:
        if self.runner is None:
            raise ValueError(
                f"{type(self).__name__} needs a rollout runner (the trainer passes one)"
            )
        self._rollout_metrics: list[dict[str, float]] = []
        self._samples: list[tuple[str, str, float]] = []

    def rollout(self, examples: Sequence[Example], **extra: float) -> dict[str, Tensor]:
        """A fresh group batch of the live policy; refused beyond ``rollout.max_staleness``."""
        batch = self.runner.rollout(examples)
        lag = check_staleness(
            batch["versions"], self.runner.engine.version, self.config.rollout.max_staleness
        )
        self._rollout_metrics.append(
            {**self.runner.last_metrics, "rollout/staleness": float(lag), **extra}
        )
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
        """Rollout metrics averaged over the step's rollouts (one per micro-batch)."""
        collected, self._rollout_metrics = self._rollout_metrics, []
        if not collected:
            return {}
        return {k: sum(m.get(k, 0.0) for m in collected) / len(collected) for k in collected[0]}

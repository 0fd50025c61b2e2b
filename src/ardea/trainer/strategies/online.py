"""What every online strategy shares: rollouts from the live policy (now or generated ahead
in the background), the staleness bound, PPO epochs and mini-batches over one rollout,
version publication, rollout metrics and samples, and the state a resumed run needs.

Mixed in before an offline strategy (``class OnlineGRPO(OnlineRollouts, GRPOStrategy)``):
the offline strategy supplies the loss; :meth:`OnlineRollouts.plan_step` supplies its
batches. One training step reads top to bottom:

1. **generate + score** (``perf/time_generate``, ``perf/time_score``): the rollout runner
   samples ``rollout.group_size`` completions per prompt and scores them. With
   ``rollout.max_staleness = 0`` this happens here, on the live policy; with η ≥ 1 the
   rollout was generated ahead by a :class:`~ardea.rollout.RolloutWorker` from a policy
   exactly ``min(η, steps so far)`` versions old, while earlier steps trained.
2. **staleness check**: a rollout from a future version or more than η versions old raises
   :class:`~ardea.rollout.StalenessError` and never reaches a loss.
3. **advantages** (``perf/time_advantages``): the strategy's :meth:`prepare_rollout` pins
   everything the loss needs on the whole rollout at once (advantages, returns, old values,
   proximal log-probs for decoupled PPO), so replayed passes reuse the same targets.
4. **updates**: ``algo.ppo_epochs`` passes, each over ``algo.ppo_mini_batches`` shuffled
   mini-batches of trajectories (one optimizer step each, split into
   ``trainer.grad_accum_steps`` micro-batches).
5. **publish**: after the step's last optimizer step the weights become the next policy
   version, in one atomic engine update (:meth:`after_train_step`).

The policy version counts published weight updates, i.e. training steps: the optimizer
steps inside one step's passes are not published (no generation sees them), as in verl and
AReaL.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ardea.data import Example, batch_rows, select_rows, trim_padding
from ardea.model import sequence_logprobs
from ardea.rollout import (
    Rollout,
    RolloutRunner,
    RolloutWorker,
    check_staleness,
    sampling_seed,
)

SHUFFLE_STREAM = 1  # sampling_seed stream of the mini-batch shuffles (rollouts use step alone)


def split_updates(
    batch: dict[str, Tensor],
    *,
    epochs: int,
    mini_batches: int,
    micro_batches: int,
    generator: torch.Generator,
) -> list[list[dict[str, Tensor]]]:
    """``epochs × mini_batches`` optimizer updates over the rows of ``batch``, each a list of
    ``micro_batches`` micro-batches (trimmed of padding columns).

    Rows are shuffled with ``generator`` at every epoch unless there is exactly one update
    (then the rollout's own order is kept). Empty parts are left out; a batch without rows
    gives no update.
    """
    rows = batch_rows(batch)
    if rows == 0:
        return []
    shuffle = epochs > 1 or mini_batches > 1
    updates = []
    for _ in range(epochs):
        order = torch.randperm(rows, generator=generator) if shuffle else torch.arange(rows)
        for mini in order.tensor_split(mini_batches):
            parts = [p for p in mini.tensor_split(micro_batches) if p.numel()]
            if parts:
                updates.append([trim_padding(select_rows(batch, p)) for p in parts])
    return updates


class OnlineRollouts:
    """Needs ``self.runner`` (a RolloutRunner), ``self.config`` and ``self.policy`` from the
    strategy; the strategy implements :meth:`prepare_rollout`."""

    sample_kind = "prompt"
    runner: RolloutRunner
    config: Any
    policy: torch.nn.Module

    def _init_online(self) -> None:
        if self.runner is None:
            raise ValueError(
                f"{type(self).__name__} needs a rollout runner (the trainer passes one)"
            )
        rollout, algo = self.config.rollout, self.config.algo
        self.max_staleness = int(rollout.max_staleness)
        self.lookahead = self.max_staleness
        self.decoupled = bool(algo.decoupled if algo.decoupled is not None else self.max_staleness)
        # trainer log-probs use the distribution the engine sampled from (T = 0: greedy's T = 1)
        self.temperature = float(rollout.temperature) or 1.0
        self.worker: RolloutWorker | None = None
        self._metrics: dict[str, float] = {}
        self._samples: list[tuple[str, str, float]] = []

    # ------------------------------------------------------------------ a step
    def plan_step(
        self,
        samples: Sequence[Example],
        *,
        step: int,
        micro_batches: int,
        upcoming: Sequence[Sequence[Example]] = (),
    ) -> list[list[dict[str, Tensor]]]:
        rollout = self._generate(samples, step, upcoming)
        batch = self.to_device(rollout.batch)
        lag = check_staleness(batch["versions"], self.runner.engine.version, self.max_staleness)
        metrics = {**rollout.metrics, "rollout/staleness": float(lag)}
        start = time.perf_counter()
        batch = self.prepare_rollout(batch, step=step, metrics=metrics)
        metrics["perf/time_advantages"] = time.perf_counter() - start
        self._metrics, self._samples = metrics, rollout.samples
        algo = self.config.algo
        seed = sampling_seed(self.config.trainer.seed, step, SHUFFLE_STREAM)
        return split_updates(
            batch,
            epochs=algo.ppo_epochs,
            mini_batches=algo.ppo_mini_batches,
            micro_batches=micro_batches,
            generator=torch.Generator().manual_seed(seed),
        )

    def prepare_rollout(
        self, batch: dict[str, Tensor], *, step: int, metrics: dict[str, float]
    ) -> dict[str, Tensor]:
        """The rollout batch with everything the loss needs pinned; may add to ``metrics``."""
        raise NotImplementedError

    def _generate(
        self, samples: Sequence[Example], step: int, upcoming: Sequence[Sequence[Example]]
    ) -> Rollout:
        if self.max_staleness == 0:
            return self.runner.rollout(samples, seed_index=step)
        if self.worker is None:  # started lazily: a resumed run starts it at its own step
            self.worker = RolloutWorker(
                self.runner.detached_copy(), max_staleness=self.max_staleness, start_step=step
            )
        self.worker.submit(step, samples)
        for ahead, examples in enumerate(upcoming, start=1):
            self.worker.submit(step + ahead, examples)
        return self.worker.result(step)

    @torch.no_grad()
    def proximal_logprobs(self, batch: dict[str, Tensor]) -> Tensor:
        """``(N, S)`` next-token log-probs of the policy as it is before this step's updates
        (decoupled PPO's proximal policy)."""
        return sequence_logprobs(
            self.policy,
            batch["input_ids"],
            batch["attention_mask"],
            chunk_size=self.config.model.logprob_chunk_size,
            temperature=self.temperature,
        ).logprobs

    # --------------------------------------------------------------- after a step
    def after_train_step(self) -> None:
        """Publish the updated weights as the next version: the shared engine's version is
        bumped (its model is the policy itself) and the worker gets a copy."""
        engine = self.runner.engine
        version = engine.version + 1
        engine.update_weights(None, version)
        if self.worker is not None:
            self.worker.publish(self.policy.state_dict(), version)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    def state_dict(self) -> dict[str, Any]:
        """The engine's policy version (rollout seeds come from the step index)."""
        return {"version": self.runner.engine.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["version"] != self.runner.engine.version:
            self.runner.engine.update_weights(None, int(state["version"]))

    def step_samples(self) -> list[tuple[str, str, float]]:
        samples, self._samples = self._samples, []
        return samples

    def step_metrics(self) -> dict[str, float]:
        metrics, self._metrics = self._metrics, {}
        return metrics

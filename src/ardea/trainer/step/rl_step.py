"""One online RL training step, read top to bottom (:meth:`RLStep.run`).

1. **generate** (``perf/time_generate``): the step's prompts, ``rollout.group_size``
   completions each, with behaviour log-probs and policy versions, from the rollout service
   (:mod:`ardea.rollout.service`, which owns the engine). With ``rollout.max_staleness = 0``
   the live policy's engine generates them now; with η ≥ 1 a
   :class:`~ardea.rollout.RolloutWorker` generated them ahead, on its own engine, from the
   policy exactly ``min(η, steps so far)`` versions old, and this phase waits for them.
   Under torchrun each rank generates its share of the prompts (vLLM servers: rank 0 all of
   them, the others wait here).
2. **score** (``perf/time_score``): the rewards (each rank its share), and one
   :class:`~ardea.data.TrajectoryBatch`; under torchrun the shares are all-gathered and
   joined first (``perf/time_gather``: :mod:`ardea.rollout.shares`).
3. **filter** (``perf/time_filter``), only with ``algo.dynamic_sampling``: groups without a
   reward spread are dropped and refilled from fresh prompts generated and scored on the
   live policy (those rounds count in generate and score),
   :mod:`ardea.rollout.dynamic_sampling`.
4. the staleness check: a batch from a future version or more than η versions old raises
   :class:`~ardea.rollout.StalenessError` and never reaches a loss (``rollout/staleness``).
5. **advantages** (``perf/time_advantages``): the frozen scorers' values (the reference's
   log-probs, a teacher's scores: :class:`~ardea.trainer.scorers.FrozenScorers`), then what
   the strategy's loss needs (:meth:`~ardea.trainer.strategies.OnlineStrategy.pin`), pinned
   on the whole batch once for every pass. Under torchrun each rank runs the pinning
   forwards on its share of the rows and gathers the others'
   (:class:`~ardea.trainer.row_shards.RowShards`): every row is scored once in the job.
6. **updates** (``perf/time_forward_backward``, ``perf/time_optimizer``):
   ``algo.ppo_epochs`` passes over ``algo.ppo_mini_batches`` mini-batches of whole groups,
   shuffled each epoch, each split into ``trainer.grad_accum_steps`` micro-batches
   (:class:`~ardea.trainer.step.updates.Updater`); under torchrun each rank takes its share
   of every micro-batch's groups (:mod:`ardea.trainer.step.split`).
7. **weight_sync** (``perf/time_weight_sync``): the updated weights become the next policy
   version, loaded into every rank's engine (under DDP from its own replica, under FSDP2
   all-gathered on the device one tensor at a time; copied for the worker); the engine's metrics. The version counts training steps (not optimizer
   steps), as in verl and AReaL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ardea.data import Example, TrajectoryBatch
from ardea.data.sampler import EpochSampler
from ardea.errors import ConfigError
from ardea.rollout import sampling_seed
from ardea.rollout.service import RolloutService
from ardea.timing import PhaseTimer
from ardea.trainer.distributed import Distributed
from ardea.trainer.step.split import shard_updates, split_updates
from ardea.trainer.step.updates import Updater, step_throughput
from ardea.trainer.strategies import OnlineStrategy
from ardea.trainer.trajectory_samples import token_rows

SHUFFLE_STREAM = 1  # sampling_seed stream of the mini-batch shuffles (rollouts use step alone)


class RLStep:
    """The online RL step (module docstring); its rollouts and weights go through the
    rollout service, which keeps the state between steps.

    Args:
        config: the run config.
        policy: the trained model.
        strategy: the online strategy (pin, loss).
        service: generates and scores the step's rollouts, publishes the weights.
        tokenizer: the policy's tokenizer (the trained rows logged token by token).
        updater: the optimizer updates.
        samples: the training prompts, drawn in order by ``sampler``.
        sampler: the run's prompt sampler.
        dist: this process's rank and the collectives.
    """

    def __init__(
        self,
        config: Any,
        *,
        policy: torch.nn.Module,
        strategy: OnlineStrategy,
        service: RolloutService,
        tokenizer: Any,
        updater: Updater,
        samples: Sequence[Example],
        sampler: EpochSampler,
        dist: Distributed,
    ) -> None:
        if config.algo.dynamic_sampling and not strategy.supports_dynamic_sampling:
            raise ConfigError(
                f"algo.dynamic_sampling=true is not supported by algo.name="
                f"{config.algo.name} (it filters groups by their reward spread for "
                "group-baseline strategies: online_grpo)"
            )
        self.config = config
        self.policy = policy
        self.strategy = strategy
        self.service = service
        self.tokenizer = tokenizer
        self.updater = updater
        self.samples = samples
        self.sampler = sampler
        self.dist = dist
        self.device = next(policy.parameters()).device
        self.last_samples: list[tuple[str, str, float]] = []
        self.last_rows: list[dict] = []  # a few trained rows, token by token

    # -------------------------------------------------------------------- a step
    def run(self, step: int) -> dict[str, float]:
        """Train step ``step`` (0-based); returns its metrics."""
        timer = PhaseTimer()
        rollout = self.service.rollout(step, self.sampler.next_batch(), timer)
        metrics, self.last_samples = dict(rollout.metrics), rollout.samples
        batch = rollout.batch.to(self.device)
        forward = self.updater.precision.forward(self.updater.policy, batch.input_ids.shape[1])
        with timer.phase("advantages"), forward:
            if batch.rows:  # the frozen scorers' values, then what the strategy pins
                batch = self.strategy.pin(self.strategy.scorers.pin(batch, metrics), metrics)
        self.last_rows = token_rows(batch, self.tokenizer)
        updates = self._updates(batch, step)
        metrics |= self.updater.run(updates, timer)
        with timer.phase("weight_sync"):
            self.service.publish()
        metrics |= self.service.engine_metrics()
        return metrics | step_throughput(updates, timer)

    def before_evaluation(self, step: int) -> None:
        """Nothing to do: every step published its weights (weight_sync)."""

    def state_dict(self) -> dict[str, Any]:
        """The rollout service's state (a background worker's rollouts ahead, the refill
        sampler), so a resumed run generates what an uninterrupted one would."""
        return self.service.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.service.load_state_dict(state)

    def _updates(self, batch: TrajectoryBatch, step: int) -> list[list[TrajectoryBatch]]:
        """The step's updates over the whole batch (the same on every rank: the same batch
        and generator), then this rank's share of each micro-batch."""
        algo = self.config.algo
        seed = sampling_seed(self.config.trainer.seed, step, SHUFFLE_STREAM)
        updates = split_updates(
            batch,
            epochs=algo.ppo_epochs,
            mini_batches=algo.ppo_mini_batches,
            micro_batches=self.config.trainer.grad_accum_steps,
            generator=torch.Generator().manual_seed(seed),
            # every rank must run as many forwards as the others; length buckets would cut
            # micro-batches of a few groups into shares that are mostly fillers
            by_length=not self.dist.active,
        )
        return shard_updates(updates, self.dist.rank, self.dist.world_size)

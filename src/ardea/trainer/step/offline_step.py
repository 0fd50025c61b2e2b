"""One offline training step, read top to bottom (:meth:`OfflineStep.run`).

1. **data** (``perf/time_data``): this rank's share of the step's ``trainer.batch_size``
   samples (drawn by the run's epoch sampler), collated into ``trainer.grad_accum_steps``
   micro-batches by the strategy;
2. **updates** (``perf/time_forward_backward``, ``perf/time_optimizer``): one optimizer
   update (:class:`~ardea.trainer.step.updates.Updater`).

The online step is :class:`~ardea.trainer.step.rl_step.RLStep`; the training loop drives
either through the same four members (``run``, ``before_evaluation``, ``last_samples`` /
``last_rows``, ``state_dict`` / ``load_state_dict``), so it never asks which it has.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ardea.data.sampler import EpochSampler
from ardea.rollout.service import RolloutService
from ardea.timing import PhaseTimer
from ardea.trainer.distributed import Distributed
from ardea.trainer.step.updates import Updater, step_throughput
from ardea.trainer.strategies import Strategy


class OfflineStep:
    """Trains on a dataset's samples (module docstring); generates nothing itself."""

    last_samples: Sequence[tuple[str, str, float]] = ()  # no rollouts to log
    last_rows: Sequence[dict] = ()

    def __init__(
        self,
        config: Any,
        *,
        strategy: Strategy,
        service: RolloutService,
        updater: Updater,
        samples: Sequence[Any],
        sampler: EpochSampler,
        dist: Distributed,
        device: torch.device,
    ) -> None:
        self.accumulation = config.trainer.grad_accum_steps
        self.strategy = strategy
        self.service = service
        self.updater = updater
        self.samples = samples
        self.sampler = sampler
        self.dist = dist
        self.device = device

    def run(self, step: int) -> dict[str, float]:
        """Train step ``step`` (0-based); returns its metrics."""
        timer = PhaseTimer()
        with timer.phase("data"):
            _, indices = self.dist.share(self.sampler.next_batch())  # this rank's share
            samples = [self.samples[i] for i in indices]
            size = -(-len(samples) // self.accumulation)
            chunks = [samples[i : i + size] for i in range(0, len(samples), size)]
            updates = [[self.strategy.collate(chunk).to(self.device) for chunk in chunks]]
        metrics = self.updater.run(updates, timer)
        return metrics | step_throughput(updates, timer)

    def before_evaluation(self, step: int) -> None:
        """Offline steps publish no weights: an evaluation after training steps hands the
        engine the policy's (every rank calls it: a collective under FSDP2)."""
        if step:
            self.service.publish()

    def state_dict(self) -> dict[str, Any]:
        return {}  # the sampler's cursor is the trainer's

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (:meth:`state_dict`)."""

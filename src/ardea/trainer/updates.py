"""The optimizer updates of one training step, for every strategy.

A training step hands :meth:`Updater.run` a list of updates, each a list of micro-batches
(offline: one update; online: ``algo.ppo_epochs`` × ``algo.ppo_mini_batches``). Per update:
``forward_backward`` (every micro-batch's loss, normalised by the update's counts and computed
under the run's autocast (:class:`ardea.model.Precision`), is back-propagated, so the accumulated gradient is that of the whole update) and ``optimizer``
(clip, step, the strategy's hook). An update whose loss or gradient is NaN/Inf is skipped
and counted. After the updates the learning-rate schedule advances once (verl's
convention) and the strategy's end-of-step hook runs. Each phase is timed under its name
(``perf/time_<phase>``) by the step's :class:`PhaseTimer`.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ardea.data import TrajectoryBatch
from ardea.model import Precision
from ardea.trainer.distributed import (
    Distributed,
    load_optimizer_state,
    optimizer_state,
)
from ardea.trainer.schedule import build_adamw, clip_gradients
from ardea.trainer.strategies import Strategy

#: step counts reduced by their maximum over the ranks (the others are summed)
MAX_COUNTS = ("horizon",)


@dataclass
class PhaseTimer:
    """Wall-clock seconds per named phase within one step (a phase may run several times)."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"perf/time_{name}": value for name, value in self.seconds.items()}


class Updater:
    """Owns the policy's optimizer, schedule and non-finite-step counts (module docstring)."""

    def __init__(
        self,
        policy: torch.nn.Module,
        strategy: Strategy,
        config: Any,
        precision: Precision,
        dist: Distributed,
    ) -> None:
        trainer = config.trainer
        self.policy = policy
        self.strategy = strategy
        self.precision = precision
        self.dist = dist
        self.max_grad_norm = trainer.max_grad_norm or float("inf")
        self.parameters = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer, self.scheduler = build_adamw(
            self.parameters, trainer, lr=trainer.lr, warmup_steps=trainer.warmup_steps
        )
        self.nonfinite = {"consecutive": 0, "total": 0}

    def run(self, updates: list[list[TrajectoryBatch]], timer: PhaseTimer) -> dict[str, float]:
        """Apply ``updates``; return each metric averaged over the updates that report it,
        with the training throughput."""
        per_update, applied = [], False
        for micro_batches in updates:
            with timer.phase("forward_backward"):
                metrics = self._forward_backward(micro_batches)
            with timer.phase("optimizer"):
                step_metrics, ok = self._optimizer_step(metrics.get("train/loss", 0.0))
            per_update.append(metrics | step_metrics)
            applied |= ok
        if applied:
            self.scheduler.step()
        self.strategy.after_train_step()
        metrics = mean_metrics(per_update)
        metrics["train/nonfinite_steps"] = float(self.nonfinite["total"])
        metrics.update(self.strategy.step_metrics())
        trained = timer.seconds.get("forward_backward", 0.0) + timer.seconds.get("optimizer", 0.0)
        metrics["perf/train_tokens_per_s"] = update_tokens(updates) / max(trained, 1e-9)
        return metrics

    def _forward_backward(self, micro_batches: list[TrajectoryBatch]) -> dict[str, float]:
        """Every micro-batch's loss back-propagated; the counts it is normalised by are the
        update's over all ranks (one all-reduce before the loop), so the summed gradient
        (and the metrics, summed over micro-batches and ranks) are the whole update's."""
        counts = self.dist.sum(self.strategy.step_counts(micro_batches), maximum=MAX_COUNTS)
        totals: dict[str, float] = {}
        trained = [self.policy, *self.strategy.trained_modules()]
        for index, batch in enumerate(micro_batches):
            last = index == len(micro_batches) - 1
            with self.dist.accumulating(trained, accumulate=not last):
                # forward in the compute dtype (and its attention kernel), backward outside
                with self.precision.forward(self.policy, batch.input_ids.shape[1]):
                    loss, metrics = self.strategy.loss(batch, counts)
                (loss * self.dist.loss_scale).backward()  # DDP/FSDP2 average; we want sums
            for name, value in metrics.items():
                totals[name] = totals.get(name, 0.0) + value
        return self.dist.sum(totals)

    def _optimizer_step(self, loss: float) -> tuple[dict[str, float], bool]:
        """Clip and step, or skip a non-finite step; returns its metrics and whether it
        was applied."""
        grad_norm = clip_gradients(self.parameters, self.max_grad_norm)
        metrics = {"train/grad_norm": grad_norm, "train/lr": self.scheduler.get_last_lr()[0]}
        applied = math.isfinite(loss) and math.isfinite(grad_norm)
        if not applied:
            self.optimizer.zero_grad(set_to_none=True)  # skip: weights stay the last good ones
            self.strategy.skip_optimizer_step()
            self.nonfinite["consecutive"] += 1
            self.nonfinite["total"] += 1
        else:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.strategy.after_optimizer_step()
            self.nonfinite["consecutive"] = 0
        return metrics, applied

    def state_dict(self) -> dict[str, Any]:
        """Optimizer state by parameter name (whole, loadable at any world size; collective),
        schedule and non-finite counts."""
        return {
            "optimizer": optimizer_state(self.policy, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "nonfinite": dict(self.nonfinite),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_optimizer_state(self.policy, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.nonfinite = dict(state["nonfinite"])


def mean_metrics(per_update: list[dict[str, float]]) -> dict[str, float]:
    """Each metric averaged over the optimizer updates of a step that report it."""
    names = dict.fromkeys(name for metrics in per_update for name in metrics)
    out = {}
    for name in names:
        values = [m[name] for m in per_update if name in m]
        out[name] = sum(values) / len(values)
    return out


def update_tokens(updates: list[list[TrajectoryBatch]]) -> int:
    """Real (attended) tokens over every micro-batch of a step's updates."""
    return sum(int(b.attention_mask.sum()) for update in updates for b in update)


def step_throughput(updates: list[list[TrajectoryBatch]], timer: PhaseTimer) -> dict[str, float]:
    """The phase timings of a finished step and its tokens per second of the whole step."""
    seconds = sum(timer.seconds.values())
    return {**timer.metrics(), "perf/tokens_per_s": update_tokens(updates) / max(seconds, 1e-9)}

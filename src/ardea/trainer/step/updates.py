"""The optimizer updates of one training step, for every strategy.

A training step hands :meth:`Updater.run` a list of updates, each a list of micro-batches
(offline: one update; online: ``algo.ppo_epochs`` × ``algo.ppo_mini_batches``). Per update:
``forward_backward`` (every micro-batch's loss, normalised by the update's counts and
computed under the run's autocast (:class:`ardea.model.Precision`), is back-propagated, so
the accumulated gradient is that of the whole update) and ``optimizer`` (every trained
component clipped and stepped, :mod:`ardea.trainer.components`). An update whose loss or
policy gradient is NaN/Inf is skipped and counted. After the updates every learning-rate
schedule advances once (verl's convention). Each phase is timed under its name
(``perf/time_<phase>``) by the step's :class:`PhaseTimer`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from ardea.algo import trusted_inputs
from ardea.data import TrajectoryBatch
from ardea.errors import ArdeaError
from ardea.model import Precision
from ardea.timing import PhaseTimer
from ardea.trainer.components import TrainedComponent
from ardea.trainer.distributed import Distributed
from ardea.trainer.step.split import Filler
from ardea.trainer.strategies import Strategy

#: step counts reduced by their maximum over the ranks (the others are summed)
MAX_COUNTS = ("horizon",)
#: metrics reduced by their maximum over micro-batches and ranks (the others are summed)
MAX_SUFFIX = "_max"
#: metrics of the state before the step's first optimizer update (e.g. the train-inference
#: mismatch): the first update's values, not the mean over the updates
FIRST_UPDATE = ("mismatch/",)


class Updater:
    """Owns the trained components (the policy first, then the strategy's: each with its
    optimizer, schedule and clipping, :mod:`ardea.trainer.components`) and the non-finite
    step counts (module docstring)."""

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
        self.components = [
            TrainedComponent.build(
                "train",
                policy,
                trainer,
                lr=trainer.lr,
                warmup_steps=trainer.warmup_steps,
                max_grad_norm=trainer.max_grad_norm,
            ),  # fmt: skip
            *strategy.trained_components(),
        ]
        self.nonfinite = {"consecutive": 0, "total": 0}

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The policy's optimizer."""
        return self.components[0].optimizer

    @property
    def scheduler(self) -> Any:
        """The policy's learning-rate schedule."""
        return self.components[0].scheduler

    def run(self, updates: list[list[TrajectoryBatch]], timer: PhaseTimer) -> dict[str, float]:
        """Apply ``updates``; return each metric averaged over the updates that report it,
        with the training throughput."""
        per_update, applied = [], False
        for update, micro_batches in enumerate(updates):
            with timer.phase("forward_backward"):
                metrics = self._forward_backward(micro_batches, update)
            with timer.phase("optimizer"):
                step_metrics, ok = self._optimizer_step(metrics.get("train/loss", 0.0))
            per_update.append(metrics | step_metrics)
            applied |= ok
        if applied:
            for component in self.components:
                component.scheduler.step()
        metrics = mean_metrics(per_update)
        # measured before any update of the step: the first update's values
        first = per_update[0] if per_update else {}
        metrics |= {k: v for k, v in first.items() if k.startswith(FIRST_UPDATE)}
        metrics["train/nonfinite_steps"] = float(self.nonfinite["total"])
        trained = timer.seconds.get("forward_backward", 0.0) + timer.seconds.get("optimizer", 0.0)
        metrics["perf/train_tokens_per_s"] = update_tokens(updates) / max(trained, 1e-9)
        return metrics

    def _forward_backward(
        self, micro_batches: list[TrajectoryBatch | Filler], update: int = 0
    ) -> dict[str, float]:
        """Every micro-batch's loss back-propagated; the counts it is normalised by are the
        update's over all ranks (one all-reduce before the loop; ``counts["update"]`` is the
        update's index in the step), so the summed gradient (and the metrics, summed over
        micro-batches and ranks, kept as tensors and read once at the end) are the whole
        update's. The loop makes no host sync of its own (the loss functions' value checks
        are off, :func:`ardea.algo.trusted_inputs`). A
        :class:`~ardea.trainer.step.split.Filler` runs its forward and backward with the loss
        times zero and adds zeros under the metrics' names (every rank reduces the same
        names)."""
        real = [b for b in micro_batches if not isinstance(b, Filler)]
        counted = real or [micro_batches[0].batch]
        longest = max(b.input_ids.shape[1] for b in counted)
        # in the compute dtype: a strategy's counts may need a forward (KTO's reference point)
        with self.precision.forward(self.policy, longest):
            counts = self.strategy.step_counts(counted)
        counts = {k: v if real else 0.0 for k, v in counts.items()}
        counts = self.dist.sum(counts, maximum=MAX_COUNTS) | {"update": float(update)}
        totals: dict[str, torch.Tensor | float] = {}
        trained = [component.module for component in self.components]
        with trusted_inputs():  # batches were checked when built: no value checks (syncs)
            for index, item in enumerate(micro_batches):
                last = index == len(micro_batches) - 1
                filler = isinstance(item, Filler)
                batch = item.batch if filler else item
                with self.dist.accumulating(trained, accumulate=not last):
                    # forward in the compute dtype (and its attention kernel), backward outside
                    with self.precision.forward(self.policy, batch.input_ids.shape[1]):
                        loss, metrics = self.strategy.loss(batch, counts)
                    scale = 0.0 if filler else self.dist.loss_scale  # DDP/FSDP2 average: sums
                    (loss * scale).backward()
                for name, value in metrics.items():
                    add_metric(totals, name, 0.0 if filler else value)
        totals = read_metrics(totals)  # the update's one read of its metric tensors
        return self.dist.sum(totals, maximum=tuple(k for k in totals if k.endswith(MAX_SUFFIX)))

    def _optimizer_step(self, loss: float) -> tuple[dict[str, float], bool]:
        """Clip and step every component, or skip a step whose loss or policy gradient is
        not finite; returns its metrics and whether it was applied."""
        policy, *others = self.components
        grad_norm = policy.clip()
        metrics = {"train/grad_norm": grad_norm}
        metrics |= {f"{c.prefix}/lr": c.lr for c in self.components}
        applied = math.isfinite(loss) and math.isfinite(grad_norm)
        if applied:
            policy.optimizer.step()
        policy.optimizer.zero_grad(set_to_none=True)  # skipped: weights stay the last good
        for component in others:
            if applied:
                metrics[f"{component.prefix}/grad_norm"] = component.step()
            component.optimizer.zero_grad(set_to_none=True)
        self.nonfinite["consecutive"] = 0 if applied else self.nonfinite["consecutive"] + 1
        self.nonfinite["total"] += 0 if applied else 1
        return metrics, applied

    def state_dict(self, *, sharded: bool = False) -> dict[str, Any]:
        """Every component's optimizer (by parameter name, whole, loadable at any world size;
        a collective under FSDP2 — or with ``sharded`` its hyperparameters alone, the moments
        being in the rank's shard file) and schedule, by metrics prefix; the non-finite
        counts."""
        return {
            "components": {c.prefix: c.state_dict(sharded=sharded) for c in self.components},
            "nonfinite": dict(self.nonfinite),
        }

    def load_state_dict(self, state: dict[str, Any], *, sharded: bool = False) -> None:
        """Load :meth:`state_dict`'s (``sharded``: whose moments are this rank's shards)."""
        stored = state["components"]
        missing = [c.prefix for c in self.components if c.prefix not in stored]
        if missing:
            raise ArdeaError(
                f"the checkpoint's trainer state has no optimizer for {', '.join(missing)}: it "
                "was written by a run of another strategy; resume from one of this run's"
            )
        for component in self.components:
            component.load_state_dict(stored[component.prefix], sharded=sharded)
        self.nonfinite = dict(state["nonfinite"])

    def module_weights(self, *, keep: bool) -> dict[str, dict[str, torch.Tensor]]:
        """The whole weights of every component besides the policy, by checkpoint
        sub-directory, on the ranks that ``keep`` them (a collective under FSDP2)."""
        return {c.checkpoint_dir: c.weights(keep=keep) for c in self.components[1:]}

    def save_modules(self, directory: Path, weights: dict[str, dict[str, torch.Tensor]]) -> None:
        """Write :meth:`module_weights` into checkpoint ``directory`` (a writing rank)."""
        for component in self.components[1:]:
            name = component.checkpoint_dir
            component.save(Path(directory) / name, weights[name])

    def load_modules(self, checkpoint: Path) -> None:
        """Read every component's weights besides the policy's from ``checkpoint``."""
        for component in self.components[1:]:
            component.load_weights(checkpoint)


def add_metric(totals: dict[str, torch.Tensor | float], name: str, value) -> None:
    """Add a micro-batch's metric ``value`` (a float or a 0-d tensor, not read) to
    ``totals``: summed, or the maximum for names ending in ``_max``."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
    if name not in totals:
        totals[name] = value
    elif not name.endswith(MAX_SUFFIX):
        totals[name] = totals[name] + value
    elif isinstance(value, torch.Tensor) or isinstance(totals[name], torch.Tensor):
        totals[name] = torch.maximum(torch.as_tensor(totals[name]), torch.as_tensor(value))
    else:
        totals[name] = max(totals[name], value)


def read_metrics(totals: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """``totals`` as floats, its tensors read in one transfer (one host sync)."""
    tensors = {k: v for k, v in totals.items() if isinstance(v, torch.Tensor)}
    out = {k: float(v) for k, v in totals.items() if k not in tensors}
    if tensors:
        device = next(iter(tensors.values())).device
        stacked = torch.stack([v.to(device, torch.float64).reshape(()) for v in tensors.values()])
        out |= dict(zip(tensors, stacked.tolist(), strict=True))
    return out


def mean_metrics(per_update: list[dict[str, float]]) -> dict[str, float]:
    """Each metric averaged over the optimizer updates of a step that report it."""
    names = dict.fromkeys(name for metrics in per_update for name in metrics)
    out = {}
    for name in names:
        values = [m[name] for m in per_update if name in m]
        out[name] = sum(values) / len(values)
    return out


def update_tokens(updates: list[list[TrajectoryBatch | Filler]]) -> int:
    """Real (attended) tokens over every micro-batch of a step's updates (fillers: none)."""
    return sum(int(b.attention_mask.sum()) for u in updates for b in u if not isinstance(b, Filler))


def step_throughput(updates: list[list[TrajectoryBatch]], timer: PhaseTimer) -> dict[str, float]:
    """The phase timings of a finished step and its tokens per second of the whole step."""
    seconds = sum(timer.seconds.values())
    return {**timer.metrics(), "perf/tokens_per_s": update_tokens(updates) / max(seconds, 1e-9)}

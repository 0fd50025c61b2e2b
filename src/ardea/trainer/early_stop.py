"""Stopping a run (or a stage) once it has learned, on a held-out metric.

After every evaluation the watched metric's history ``[[step, value], ...]`` (one entry per
evaluation, the one before training first) decides:

- **target** (``trainer.early_stop_target``): stop at the first evaluation whose value
  reaches the target (``value >= target`` in mode ``max``, ``value <= target`` in ``min``);
- **patience** (``trainer.early_stop_patience`` = p): stop at the p-th evaluation in a row
  that does not beat the best value before it by more than ``trainer.early_stop_min_delta``
  (in mode ``max`` a gain means ``value > best + min_delta``).

The watched metric is ``trainer.early_stop_metric``; ``auto`` is the metric
``trainer.keep_best`` watches (:data:`ardea.trainer.watch.WATCHED`: held-out accuracy, else
success rate, else mean reward). The verdict is a function of the history alone, so a run
resumed from its last checkpoint (which holds the history) reaches the same one: a run that
stopped early stays stopped under ``trainer.resume=auto``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ardea.errors import ConfigError
from ardea.trainer.watch import WATCHED

History = Mapping[str, Sequence[Sequence[float]]]


@dataclass(frozen=True)
class EarlyStop:
    """The early-stop rule of one run: see the module docstring."""

    metric: str
    mode: str
    target: float | None
    patience: int
    min_delta: float

    @classmethod
    def of(cls, trainer: Any) -> EarlyStop | None:
        """The rule ``trainer`` (a :class:`~ardea.config.TrainerConfig`) sets, or None when it
        sets neither a target nor a patience."""
        if trainer.early_stop_target is None and not trainer.early_stop_patience:
            return None
        return cls(
            metric=trainer.early_stop_metric,
            mode=trainer.early_stop_mode,
            target=trainer.early_stop_target,
            patience=trainer.early_stop_patience,
            min_delta=trainer.early_stop_min_delta,
        )

    def watched(self, history: History) -> str:
        """The metric's name; a ConfigError when the evaluations do not report it."""
        if self.metric != "auto":
            if self.metric in history:
                return self.metric
            raise ConfigError(
                f"trainer.early_stop_metric={self.metric!r} is not among this run's held-out "
                f"metrics: {', '.join(sorted(history)) or 'none'}"
            )
        name = next((n for n in WATCHED if n in history), None)
        if name is None:
            raise ConfigError(
                f"trainer.early_stop_metric=auto watches {', '.join(WATCHED)}, but this run's "
                f"evaluation reports none of them ({', '.join(sorted(history)) or 'nothing'}): "
                "name one in trainer.early_stop_metric"
            )
        return name

    def verdict(self, history: History) -> str | None:
        """Why the run stops after the last evaluation of ``history``, or None to go on."""
        name = self.watched(history)
        entries = history[name]
        step, value = int(entries[-1][0]), float(entries[-1][1])
        sign = 1.0 if self.mode == "max" else -1.0
        if self.target is not None and sign * (value - self.target) >= 0:
            relation = ">=" if sign > 0 else "<="
            return f"{name} {value:.4g} {relation} trainer.early_stop_target {self.target:g}"
        if self.patience:
            best, waited = None, 0
            for _, seen in entries:
                if best is None or sign * (seen - best) > self.min_delta:
                    best, waited = seen, 0
                else:
                    waited += 1
            if waited >= self.patience:
                return (
                    f"{name} has not improved on {best:.4g} for {waited} evaluations "
                    f"(trainer.early_stop_patience {self.patience}) at step {step}"
                )
        return None

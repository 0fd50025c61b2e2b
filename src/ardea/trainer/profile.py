"""Where a run's training time goes: every phase of the step (``perf/time_<phase>``),
averaged over the steps of this invocation, and what no phase accounts for (``other``:
logging, the progress bar, Python between phases).

Written to ``results.json`` under ``profile`` and printed at the end of ``ardea train``."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

PREFIX = "perf/time_"


class StepProfile:
    """Seconds per phase, summed over steps (one :meth:`add` per training step)."""

    def __init__(self) -> None:
        self.steps = 0
        self.seconds = 0.0
        self.phases: dict[str, float] = {}

    def add(self, metrics: dict[str, float], seconds: float) -> None:
        """One step: its ``perf/time_*`` metrics and its wall time."""
        self.steps += 1
        self.seconds += seconds
        for name, value in metrics.items():
            if name.startswith(PREFIX):
                phase = name[len(PREFIX) :]
                self.phases[phase] = self.phases.get(phase, 0.0) + value

    def summary(self) -> dict[str, Any]:
        """``{"steps", "seconds_per_step", "phases": {name: {"seconds_per_step",
        "share"}}}``, ``other`` last; empty before any step."""
        if not self.steps:
            return {}
        other = max(0.0, self.seconds - sum(self.phases.values()))
        phases = {**self.phases, "other": other}
        total = max(self.seconds, 1e-12)
        return {
            "steps": self.steps,
            "seconds_per_step": round(self.seconds / self.steps, 6),
            "phases": {
                name: {
                    "seconds_per_step": round(value / self.steps, 6),
                    "share": round(value / total, 4),
                }
                for name, value in phases.items()
            },
        }


def print_profile(summary: dict[str, Any], console: Console | None = None) -> None:
    """The profile as a table: each phase's seconds per step and share of the step."""
    if not summary:
        return
    table = Table(
        title=f"time per training step: {summary['seconds_per_step']:.4f} s over "
        f"{summary['steps']} steps"
    )
    table.add_column("phase")
    table.add_column("s / step", justify="right")
    table.add_column("share", justify="right")
    for name, phase in summary["phases"].items():
        table.add_row(name, f"{phase['seconds_per_step']:.4f}", f"{phase['share']:.1%}")
    (console or Console()).print(table)

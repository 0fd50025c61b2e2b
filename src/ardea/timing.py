"""Wall-clock time per named phase of a step (``perf/time_<phase>``), for every layer that
runs one: the rollout service times generate / score / filter, the updater
forward_backward / optimizer."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field


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

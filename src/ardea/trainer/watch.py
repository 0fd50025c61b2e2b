"""Watching a run's evaluations: a one-line warning when one falls far below the best so
far (a silent collapse), and which evaluation is the best (``trainer.keep_best``).

The watched metric is the first of :data:`WATCHED` that the evaluation reports: held-out
accuracy for tasks, success rate for agent environments, mean reward otherwise; higher is
better for all three. An evaluation counts as a collapse when it lies below the best
earlier one by more than ``max(COLLAPSE_DROP, COLLAPSE_FRACTION * |best|)``: for an
accuracy of 0.90 that is below 0.45, for one of 0.10 below 0.00 (never), so noise around a
low value does not warn, and a fall to half of a good value does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

WATCHED = ("eval/accuracy", "eval/success_rate", "eval/reward_mean")
COLLAPSE_DROP = 0.1  # the smallest fall that warns, in the metric's units
COLLAPSE_FRACTION = 0.5  # ... or this fraction of the best value, whichever is larger


def best_before(history: Sequence[Sequence[float]]) -> tuple[int, float] | None:
    """``(step, value)`` of the best entry of ``history`` (``[[step, value], ...]``; the
    earliest of equal values), or None when it is empty."""
    best = None
    for step, value in history:
        if best is None or value > best[1]:
            best = (int(step), float(value))
    return best


def collapse_warning(name: str, step: int, value: float, best: tuple[int, float]) -> str | None:
    """The one-line warning when ``value`` at ``step`` fell far below ``best`` (module
    docstring), else None."""
    best_step, best_value = best
    if best_value - value <= max(COLLAPSE_DROP, COLLAPSE_FRACTION * abs(best_value)):
        return None
    return (
        f"warning: {name} fell to {value:.4g} at step {step}, far below its best {best_value:.4g} "
        f"at step {best_step}: the run may have collapsed (a lower trainer.lr often helps; "
        "trainer.keep_best=true keeps the best checkpoint)"
    )


def judge(
    history: Mapping[str, Sequence[Sequence[float]]], step: int
) -> tuple[str, str | None, bool] | None:
    """The evaluation of ``step``, the last entry of ``history`` (``{name: [[step, value],
    ...]}``): its watched metric, the collapse warning or None, and whether it is a new best
    (the first evaluation is); None when no watched metric was evaluated at ``step``."""
    name = next((n for n in WATCHED if history.get(n) and history[n][-1][0] == step), None)
    if name is None:
        return None
    *earlier, (_, value) = history[name]
    best = best_before(earlier)
    if best is None:
        return name, None, True
    return name, collapse_warning(name, step, value, best), value > best[1]

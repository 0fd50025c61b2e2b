"""What a run logged, read back, and two runs' logged metrics compared (the torchrun tests
compare a run at two processes with the same run in one)."""

from __future__ import annotations

import json
from pathlib import Path

#: metrics that time or rate the work, or count what ran at the same time (a vLLM server's
#: peak of requests in flight): they differ between any two runs; and the record's
#: wall-clock ``time``
TIMED = ("perf/", "_seconds", "per_s", "time_", "_peak_in_flight")
WALL_CLOCK = "time"
#: metrics of the rollout and its scores: every row is seeded by its global row, whichever
#: rank generates it, so they are the same numbers at any world size
ROLLOUT = ("rollout/", "reward/", "agent/")
#: ... except those the trainer's forwards compute on the rollout (the KL to the reference,
#: from every rank's log-probs: the same up to float32 summation order)
FROM_TRAINER = ("rollout/kl",)


def step_metrics(run_dir: Path, step: int) -> dict[str, float]:
    """What the run logged for training ``step``, without timings."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (record,) = [r for r in map(json.loads, lines) if r["step"] == step and "train/loss" in r]
    return {k: v for k, v in record.items() if k != WALL_CLOCK and not any(t in k for t in TIMED)}


def assert_same_step_metrics(expected: Path, got: Path, step: int, rtol: float) -> None:
    """Every metric two runs logged for ``step`` (from the same weights, at two world
    sizes) is the same: the rollout's exactly, every other one (``train/``, ``loss/``,
    ``critic/``, ``mismatch/``, ...) up to float32 summation order. Such a metric is a sum of
    float32 terms of order one or less, so it is within ``rtol`` of its magnitude (or of 1,
    for a mean near zero such as the advantages'); a metric that is one rank's share of the
    step (half of it here) is far outside."""
    first, second = step_metrics(expected, step), step_metrics(got, step)
    assert first.keys() == second.keys(), sorted(first.keys() ^ second.keys())
    exact = {k for k in first if k.startswith(ROLLOUT) and k not in FROM_TRAINER}
    assert {k: second[k] for k in exact} == {k: first[k] for k in exact}
    far = {
        k: (first[k], second[k])
        for k in first.keys() - exact
        if abs(second[k] - first[k]) > rtol * max(abs(first[k]), abs(second[k]), 1.0)
    }
    assert not far, far

"""What a reward function may return besides a plain list: the list with metrics.

A reward function returns one number (or None) per completion. One that has more to say
about the batch (an LLM judge's requests and tokens) returns a :class:`ScoredValues`: the
same list, with ``metrics`` (name → number). The scorer logs them per batch as
``reward/<function>/<name>``. They are totals over the batch (requests, tokens): a rollout
scored in parts, one per process of a torchrun job, logs their sums
(:meth:`~ardea.reward.ScoreResult.join`).
"""

from __future__ import annotations

from typing import Any


class ScoredValues(list):
    """A reward function's values (a list) and its batch ``metrics``."""

    def __init__(self, values: Any = (), *, metrics: dict[str, float] | None = None) -> None:
        super().__init__(values)
        self.metrics = dict(metrics or {})  # pickled with the items (process executor)

"""Stop strings in the in-process engine: a row ends at the token that completes one of
``SamplingParams.stop`` in its generated text (the tokens through that one are kept, finish
reason ``stop``: what vLLM returns for a stop string, and what the agent client records).

The text is checked after every step, so a match is found at the step of the token that
completes it; only the tail of the row is decoded: a match ending at the newest token lies
within its last ``len(longest stop) + 8`` tokens when tokens decode to at least one
character each (special and byte tokens: the 8 spare). Costs one host sync per step (the
new tokens), paid only by calls that give stop strings. Before ``min_new_tokens`` no row
ends (as in vLLM); a stop string completed earlier ends its row at ``min_new_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SPARE_TOKENS = 8


class StopWatch:
    """The generated tokens of running rows, checked for ``stops`` step by step.

    Args:
        tokenizer: decodes the rows' tokens (special tokens kept as text).
        stops: the stop strings (non-empty).

    A row is any object with ``tokens`` (its completion before it joined: a resumed prefix
    is checked too) and a ``stop_seen`` flag, which the watch sets.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str]) -> None:
        if tokenizer is None:
            raise ValueError("stop strings need the engine's tokenizer (none was given)")
        self.tokenizer = tokenizer
        self.stops = list(stops)
        self.window = max(len(s) for s in self.stops) + SPARE_TOKENS
        self.tails: dict[Any, list[int]] = {}

    def step(self, rows: Sequence[Any], new: Sequence[int], live: Sequence[bool]) -> list[bool]:
        """Append each live row's new token; whether its text holds a stop string (now or
        since an earlier step)."""
        hits = []
        for row, token, alive in zip(rows, new, live):
            if alive and not row.stop_seen:
                ids = self.tails.setdefault(row, list(row.tokens[-self.window :]))
                ids.append(token)
                del ids[: -self.window]
                tail = self.tokenizer.decode(ids, skip_special_tokens=False)
                row.stop_seen = any(s in tail for s in self.stops)
            hits.append(alive and row.stop_seen)
        return hits

    def forget(self, rows: Sequence[Any]) -> None:
        """Drop the state of rows that left."""
        for row in rows:
            self.tails.pop(row, None)

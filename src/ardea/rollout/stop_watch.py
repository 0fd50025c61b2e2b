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
    """The generated tokens of a batch's rows, checked for ``stops`` step by step.

    Args:
        tokenizer: decodes the rows' tokens (special tokens kept as text).
        stops: the stop strings (non-empty).
        rows: the batch's number of rows.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str], rows: int) -> None:
        if tokenizer is None:
            raise ValueError("stop strings need the engine's tokenizer (none was given)")
        self.tokenizer = tokenizer
        self.stops = list(stops)
        self.window = max(len(s) for s in self.stops) + SPARE_TOKENS
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.seen = [False] * rows  # the row's text holds a stop string

    def step(self, rows: Sequence[int], new: Sequence[int], live: Sequence[bool]) -> list[bool]:
        """Append each live row's new token (``rows``: their batch rows); whether its text
        holds a stop string (now or since an earlier step)."""
        hits = []
        for row, token, alive in zip(rows, new, live):
            if alive and not self.seen[row]:
                ids = self.tokens[row]
                ids.append(token)
                tail = self.tokenizer.decode(ids[-self.window :], skip_special_tokens=False)
                self.seen[row] = any(s in tail for s in self.stops)
            hits.append(alive and self.seen[row])
        return hits

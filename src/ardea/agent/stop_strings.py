"""Where a generated text first contains one of some strings (``stop`` sequences, the end of a
tool call), in tokens.

Decoding is not additive over tokens (a multi-byte character may span two), so the cut is
found by decoding prefixes: the shortest prefix of the ids whose text contains a marker
(binary search; a longer prefix's text extends a shorter one's). The tokens kept are those
up to and including the one that completes the match: the model sampled them, so they are
what is recorded and trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def first_match(text: str, markers: Sequence[str]) -> tuple[int, str] | None:
    """``(position, marker)`` of the earliest occurrence of any marker in ``text``."""
    found = [(text.find(m), m) for m in markers if m and text.find(m) >= 0]
    return min(found, key=lambda f: (f[0], -len(f[1]))) if found else None


def cut_at(
    tokenizer: Any, ids: Sequence[int], markers: Sequence[str], *, keep: bool
) -> tuple[int, str] | None:
    """``(n, text)``: the number of ``ids`` through the token completing the first marker
    and the text up to the marker (``keep=False``: what an OpenAI server returns for a stop
    sequence) or through it; None when no marker occurs."""
    if not markers or first_match(_decode(tokenizer, ids), markers) is None:
        return None
    low, high = 1, len(ids)
    while low < high:  # the shortest prefix whose text holds a marker
        mid = (low + high) // 2
        if first_match(_decode(tokenizer, ids[:mid]), markers) is None:
            low = mid + 1
        else:
            high = mid
    text = _decode(tokenizer, ids[:low])
    at, marker = first_match(text, markers)
    return low, text[: at + len(marker)] if keep else text[:at]


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False)

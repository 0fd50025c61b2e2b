"""Reading a Tinker request's JSON fields: each with its type, range and pattern checked
before any work, every error naming ``route.field`` and the value.

Names that end up on disk (session ids, model ids, checkpoint names) match strict patterns:
letters, digits, ``_``, ``-`` and inner dots or colons, never starting with a dot, never a
``/`` — so no name from a request can climb out of the state directory (the store checks
the resolved path as well).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ardea.agent.request_checks import shown
from ardea.service.tinker_wire import WireError

SESSION = r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}"
SESSION_ID = re.compile(SESSION)
MODEL_ID = re.compile(rf"({SESSION}):train:(\d{{1,9}})")
SAMPLING_ID = re.compile(rf"({SESSION}):sample:(\d{{1,9}})")
NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.:-]{0,127}")
MAX_INT32 = 2**31 - 1
MAX_ID_NUMBER = 10**9 - 1  # the <n> of model and sampling ids (MODEL_ID: 9 digits)
MAX_SEQ = 2**62  # a request's seq_id
_MISSING = object()


class Fields:
    """The fields of one JSON object of a request (``at``: its name in errors)."""

    def __init__(self, body: Any, at: str) -> None:
        if not isinstance(body, dict):
            raise WireError(f"{at} must be a JSON object, got {shown(body)}")
        self.body = body
        self.at = at

    def _get(self, name: str, default: Any) -> Any:
        value = self.body.get(name, default)
        if value is _MISSING:
            raise WireError(f"{self.at}.{name} is missing")
        return value

    def fail(self, name: str, value: Any, wanted: str) -> WireError:
        return WireError(f"{self.at}.{name}={shown(value)}: {wanted}")

    def integer(self, name: str, default: Any = _MISSING, *, low: int = 0,
                high: int = MAX_INT32) -> Any:  # fmt: skip
        """An integer in ``[low, high]`` (not a bool, not a float such as ``2.7``)."""
        value = self._get(name, default)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(name, value, f"must be an integer in [{low}, {high}]")
        return value

    def number(self, name: str, default: Any = _MISSING, *, low: float = -math.inf,
               high: float = math.inf, above: bool = False) -> Any:  # fmt: skip
        """A finite number in ``[low, high]`` (``(low, high]`` when ``above``)."""
        value = self._get(name, default)
        if value is None and default is None:
            return None
        ok = not isinstance(value, bool) and isinstance(value, int | float)
        ok = ok and math.isfinite(value) and (value > low if above else value >= low)
        if not (ok and value <= high):
            side = "(" if above else "["
            raise self.fail(name, value, f"must be a finite number in {side}{low}, {high}]")
        return float(value)

    def flag(self, name: str, default: Any = _MISSING) -> Any:
        value = self._get(name, default)
        if value is None and default is None:
            return None
        if not isinstance(value, bool):
            raise self.fail(name, value, "must be true or false")
        return value

    def text(self, name: str, default: Any = _MISSING, *, pattern: re.Pattern | None = None,
             max_length: int = 4096) -> Any:  # fmt: skip
        value = self._get(name, default)
        if value is None and default is None:
            return None
        if not isinstance(value, str) or not 0 < len(value) <= max_length:
            raise self.fail(name, value, f"must be a string of 1 to {max_length} characters")
        if pattern is not None and not pattern.fullmatch(value):
            raise self.fail(name, value, f"must match {pattern.pattern}")
        return value

    def nested(self, name: str) -> Fields:
        """A nested object (absent or null: an empty one)."""
        value = self.body.get(name)
        return Fields({} if value is None else value, f"{self.at}.{name}")


@dataclass(frozen=True)
class TinkerLimits:
    """What one request, and the requests in flight, may ask of the Tinker server (each
    over-limit request is refused before any work, naming the limit and the value).

    ``max_sample_tokens``: ``num_samples × max_tokens`` of one ``asample`` (400 past it);
    ``max_sampling_in_flight``: that product summed over the ``asample`` calls not finished
    (429 past it: the SDK retries); ``max_queued``: requests of one training model waiting or
    running (429); ``max_metadata_bytes``: a model's ``user_metadata`` as JSON. A LoRA rank is
    at most the base model's hidden size, a datum at most its context."""

    max_sample_tokens: int = 2**18
    max_sampling_in_flight: int = 2**20
    max_queued: int = 32
    max_metadata_bytes: int = 64 * 2**10

    def __post_init__(self) -> None:
        for name in ("max_sample_tokens", "max_sampling_in_flight", "max_queued",
                     "max_metadata_bytes"):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WireError(f"Tinker server limit {name}={value!r}: must be an integer >= 1")

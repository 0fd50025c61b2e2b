"""Reading final answers out of text: plain numbers exactly, anything else via math-verify.

Numbers are compared as exact fractions of their decimal spelling, so ``"2.50"`` equals
``"2.5"`` and ``"1,234"`` equals ``"1234"``; no floating-point tolerance is involved.
``math_equal`` runs ``math_verify.parse`` / ``verify`` with their own ``signal.alarm``
timeouts switched off (they only work on the main thread, and reward functions run in
worker threads): the caller bounds the time, e.g. the reward scorer's per-call timeout.
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction

# A number: optional sign (a minus right after a digit, letter or ')' is an operator, not a
# sign), digits with optional thousands separators, optional decimal part.
NUMBER_PATTERN = r"(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+(?!\d|,\d)|\d+)(?:\.\d+)?"
_NUMBER = re.compile(NUMBER_PATTERN)
_PLAIN_NUMBER = re.compile(r"\s*\$?\s*(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)\s*\.?\s*")


def _to_fraction(spelling: str) -> Fraction:
    return Fraction(spelling.replace(",", ""))


def parse_number(text: str) -> Fraction | None:
    """The value of ``text`` when it is one plain number (``"-3"``, ``"1,234"``, ``"$2.50"``,
    a trailing full stop allowed), else ``None``."""
    match = _PLAIN_NUMBER.fullmatch(str(text))
    return _to_fraction(match.group(1)) if match else None


def last_number(text: str) -> Fraction | None:
    """The value of the last number written in ``text``, or ``None`` if there is none.

    ``"so 5-3 = 2"`` → 2; ``"It costs -3."`` → -3; ``"1,234 apples"`` → 1234.
    """
    found = _NUMBER.findall(text)
    return _to_fraction(found[-1]) if found else None


class _DropTimeoutWarning(logging.Filter):
    """math-verify warns once that its own timeout is off; ours is on, so drop that line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


_FILTERED = False


def _math_verify():
    global _FILTERED
    import math_verify  # imported on first use: it pulls in sympy (about a second)

    if not _FILTERED:
        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(_DropTimeoutWarning())
        _FILTERED = True
    return math_verify


def parse_gold(gold: str) -> list:
    """math-verify's parse of a reference answer; bare LaTeX (``\\sqrt{2}``) is tried in
    ``$...$`` too. An empty list means the reference could not be parsed."""
    mv = _math_verify()
    parsed = mv.parse(gold, parsing_timeout=None)
    if not parsed and "$" not in gold and "\\boxed" not in gold:
        parsed = mv.parse(f"${gold}$", parsing_timeout=None)
    return parsed


def math_answer(completion: str) -> str | None:
    """math-verify's parse of ``completion``'s answer (a ``\\boxed{}`` or LaTeX answer
    first, else the last expression) as text, or None when it finds none."""
    answer = _math_verify().parse(completion, parsing_timeout=None)
    return str(answer[0]) if answer else None


def math_equal(gold: str, completion: str) -> bool | None:
    """Whether ``completion``'s answer (a ``\\boxed{}`` or LaTeX answer first, else the
    last expression) equals ``gold`` according to math-verify; ``None`` when the gold
    answer itself cannot be parsed."""
    parsed_gold = parse_gold(gold)
    if not parsed_gold:
        return None
    mv = _math_verify()
    answer = mv.parse(completion, parsing_timeout=None)
    if not answer:
        return False
    return bool(mv.verify(parsed_gold, answer, timeout_seconds=None))

"""Built-in reward functions (registered on import of :mod:`ardea.reward`).

Each takes ``(prompts, completions, rows)`` and returns one value per completion; answer
checks read the reference from ``rows[i]["answer"]`` (a prompt record's ``answer`` column, or
a task example's answer: :func:`example_row`).

================  ==========================================================================
``exact_match``   1 if ``completion.strip() == str(answer).strip()``.
``numeric_match`` 1 if the last number in the completion equals the answer exactly
                  (``"1,234"``, ``"-3"``, ``"2.50"`` = ``"2.5"``); None if the answer is
                  not a plain number.
``math_verify``   1 if math-verify finds the completion's answer (``\\boxed{}`` / LaTeX
                  first) equal to the answer; None if the answer cannot be parsed.
``format_boxed``  1 if the completion contains a non-empty, brace-balanced ``\\boxed{...}``.
``format_regex``  1 if ``pattern`` matches (``re.search``, or the whole completion with
                  ``full=true``); ``flags`` over ``"ims"`` (ignorecase, multiline, dotall).
``task``          the task's own ``score`` (kwarg ``task``: a :class:`Task`); built with
                  :func:`task_reward` since a task is not a config value.
================  ==========================================================================
"""

from __future__ import annotations

import re
from typing import Any

from ardea.data.prompt_data import RolloutPrompt, reward_row
from ardea.data.tasks import Example, Task
from ardea.data.tasks.answers import last_number, math_equal, parse_number
from ardea.errors import ConfigError
from ardea.reward.registry import RewardFn, make_reward, register_reward


def example_row(example: RolloutPrompt) -> dict[str, Any]:
    """The row reward functions receive with a completion of ``example``: a task example's
    ``{"prompt", "answer", "meta"}``, or a prompt record's columns as they are in its file
    (:func:`ardea.data.reward_row`)."""
    return reward_row(example)


def _answer(row: dict) -> Any:
    if not isinstance(row, dict) or "answer" not in row:
        keys = ", ".join(map(str, row)) if isinstance(row, dict) else type(row).__name__
        raise KeyError(f"the row has no 'answer' field (it has: {keys or 'nothing'})")
    return row["answer"]


@register_reward("exact_match")
def exact_match(prompts: list[str], completions: list[str], rows: list[dict]) -> list[float]:
    return [float(c.strip() == str(_answer(row)).strip()) for c, row in zip(completions, rows)]


def _numeric(completion: str, gold: Any) -> float | None:
    expected = parse_number(str(gold))
    if expected is None:
        return None
    return float(last_number(completion) == expected)


@register_reward("numeric_match")
def numeric_match(
    prompts: list[str], completions: list[str], rows: list[dict]
) -> list[float | None]:
    return [_numeric(c, _answer(row)) for c, row in zip(completions, rows)]


def _math(completion: str, gold: Any) -> float | None:
    equal = math_equal(str(gold), completion)
    return None if equal is None else float(equal)


@register_reward("math_verify")
def math_verify(prompts: list[str], completions: list[str], rows: list[dict]) -> list[float | None]:
    return [_math(c, _answer(row)) for c, row in zip(completions, rows)]


def has_boxed(text: str) -> bool:
    """Whether ``text`` contains ``\\boxed{...}`` with balanced braces and non-blank content."""
    start = text.find("\\boxed{")
    while start != -1:
        depth, i = 1, start + len("\\boxed{")
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0 and text[start + len("\\boxed{") : i - 1].strip():
            return True
        start = text.find("\\boxed{", start + 1)
    return False


@register_reward("format_boxed")
def format_boxed(prompts: list[str], completions: list[str], rows: list[dict]) -> list[float]:
    return [float(has_boxed(c)) for c in completions]


_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL}


def _compile(pattern: str, flags: str) -> re.Pattern:
    if not isinstance(pattern, str):
        raise ConfigError(f"format_regex: pattern={pattern!r} must be a string")
    if not isinstance(flags, str) or any(f not in _FLAGS for f in flags):
        raise ConfigError(f"format_regex: flags={flags!r} must be a string over 'ims'")
    value = 0
    for f in flags:
        value |= _FLAGS[f]
    try:
        return re.compile(pattern, value)
    except re.error as err:
        raise ConfigError(
            f"format_regex: pattern={pattern!r} is not a valid regex: {err}"
        ) from None


def _check_regex(pattern: str, full: bool = False, flags: str = "") -> None:
    _compile(pattern, flags)
    if not isinstance(full, bool):
        raise ConfigError(f"format_regex: full={full!r} must be true or false")


@register_reward("format_regex", check=_check_regex)
def format_regex(
    prompts: list[str],
    completions: list[str],
    rows: list[dict],
    *,
    pattern: str,
    full: bool = False,
    flags: str = "",
) -> list[float]:
    regex = _compile(pattern, flags)  # re caches compiled patterns
    match = regex.fullmatch if full else regex.search
    return [float(match(c) is not None) for c in completions]


def _example(prompt: str, row: dict) -> Example:
    meta = row.get("meta") or {}
    return Example(str(row.get("prompt", prompt)), str(_answer(row)), dict(meta))


@register_reward("task")
def task_score(
    prompts: list[str], completions: list[str], rows: list[dict], *, task: Task
) -> list[float]:
    return [float(task.score(c, _example(p, row))) for p, c, row in zip(prompts, completions, rows)]


def task_reward(task: Task) -> RewardFn:
    """A reward function (named ``task``) that scores with ``task.score``; rows are
    :func:`example_row` dicts (``prompt`` falls back to the prompt, ``meta`` to {})."""
    if not isinstance(task, Task):
        raise ConfigError(f"task_reward needs a Task, got {type(task).__name__}")
    fn = make_reward("task", task=task)
    fn.task = task  # type: ignore[attr-defined]  (the rollout's accuracy reuses its scores)
    return fn

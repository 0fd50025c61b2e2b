"""Held-out problems from a file: ``{"prompt", "answer", <any other columns>}`` records
become :class:`~ardea.data.Example`s that a task's verifier scores (``ardea eval --data``).

``answer`` is the reference answer as the task writes it (a string, or a number written as
text); every other column lands in ``Example.meta`` (e.g. countdown's ``numbers`` and
``target``), where a task's ``score`` may read it.
"""

from __future__ import annotations

from pathlib import Path

from ardea.data.records import read_records
from ardea.data.tasks.base import Example
from ardea.errors import ArdeaError


def read_examples(path: str | Path) -> list[Example]:
    """The file's records as examples, in file order; a record without a string ``prompt``
    or a string / number ``answer`` is an error naming its file and line."""
    examples = []
    for record in read_records(path):
        data = dict(record.data)
        prompt, answer = data.pop("prompt", None), data.pop("answer", None)
        if not isinstance(prompt, str) or not prompt:
            raise record.error("needs a non-empty string 'prompt' (the problem as asked)")
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise record.error(
                f"needs an 'answer' (a string or a number: the reference answer), got {answer!r}"
            )
        examples.append(Example(prompt, str(answer), data))
    if not examples:
        raise ArdeaError(f"{path} holds no records")
    return examples

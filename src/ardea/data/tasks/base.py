"""The task interface and its registry.

A task generates problems with verifiable answers: ``examples(split, n)`` returns
``n`` deterministic :class:`Example`s of the ``train`` or ``test`` split (the two are
disjoint), ``score(completion, example)`` says whether a completion solves one, and
``extract_answer(completion, example)`` which answer it gives (for majority voting).
Tasks are created by registered name (or the dotted path of a :class:`Task` subclass) with
explicit keyword arguments; an unknown name or argument is an error that lists the allowed
ones.
"""

from __future__ import annotations

import inspect
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from ardea.errors import ConfigError
from ardea.registry import Registry, subclass_check

SPLITS = ("train", "test")


@dataclass(frozen=True)
class Example:
    """One problem: the prompt text, the reference answer text, extra fields, and the
    ``demonstration`` SFT trains on when it differs from the answer (a demonstrator's
    mistake; None: the answer itself). Rewards and evaluation always check ``answer``."""

    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)
    demonstration: str | None = None

    @property
    def demonstrated(self) -> str:
        """The text SFT trains on: the demonstration, else the answer."""
        return self.answer if self.demonstration is None else self.demonstration


class Task(ABC):
    """A source of prompts with verifiable answers."""

    name: str = ""

    @abstractmethod
    def examples(self, split: str, n: int) -> list[Example]:
        """``n`` examples of ``split`` ('train' or 'test'), the same on every call."""

    @abstractmethod
    def score(self, completion: str, example: Example) -> float:
        """1.0 when ``completion`` answers ``example`` correctly, else 0.0."""

    def extract_answer(self, completion: str, example: Example) -> Hashable | None:
        """The answer ``completion`` gives, as :meth:`score` reads it, in a form where equal
        answers compare equal (maj@k votes on it); None when it gives none. A task that does
        not override this has no majority vote (``maj@k`` is then an error naming it)."""
        raise NotImplementedError(f"task {self.name!r} does not extract answers")

    def wrong_answer(self, example: Example, rng: random.Random) -> str | None:
        """A plausible wrong answer to ``example``, drawn with ``rng``: the rejected reply of
        the task's built-in preference pairs (reward-model training, DPO without a data
        file). None: the task has no such answers."""
        return None


TASKS: Registry[type[Task]] = Registry(
    "task", "tasks", field="data.task", check=subclass_check(Task, "ardea.data.Task")
)


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    """Class decorator: make a :class:`Task` available as ``data.task=<name>``."""

    def decorate(cls: type[Task]) -> type[Task]:
        TASKS.register(name)(cls)
        cls.name = name
        return cls

    return decorate


def task_names() -> list[str]:
    return TASKS.names()


def task_class(name: str) -> type[Task]:
    """The task class registered as ``name``, or the :class:`Task` subclass at dotted path
    ``name``."""
    return TASKS.get(name)


def make_task(name: str, *, seed: int = 0, **kwargs: Any) -> Task:
    """Create the task registered as ``name`` with its keyword arguments.

    Raises:
        ConfigError: an unknown task, an unknown argument, or a required one missing.
    """
    cls = task_class(name)
    params = inspect.signature(cls.__init__).parameters
    allowed = [p for p in params if p not in ("self", "seed")]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ConfigError(
            f"unknown argument(s) {', '.join(unknown)} in data.task_args for task {name!r}; "
            f"allowed: {', '.join(allowed) or '(none)'}"
        )
    missing = [p for p in allowed if params[p].default is params[p].empty and p not in kwargs]
    if missing:
        raise ConfigError(
            f"task {name!r} needs data.task_args.{missing[0]}; its arguments: {', '.join(allowed)}"
        )
    return cls(seed=seed, **kwargs)

"""Environments: a small protocol shaped like gymnasium's, and their registry.

An environment plays one episode at a time against the model:

    messages = env.reset(row)                      # the conversation's first messages
    observation, reward, done, info = env.step(reply)

``row`` is one item of the environment's data (:meth:`Environment.rows`: a dict, e.g. the
number to guess); ``reply`` is the model's reply, a :class:`~ardea.agent.reply.Reply`: the
text as generated (it is a ``str``, tool calls included, so code written against text keeps
working) with the tool calls the run's ``agent.tool_parser`` found in it (``reply.calls``;
:meth:`Environment.run_tools` runs them). Nothing re-parses the text, so an environment
sees the calls the client and the export see, in any model family's format. ``observation`` is the list of messages to append after the reply (an
environment reply as a ``user`` message, tool results as ``tool`` messages); ``info`` may
count ``tool_calls`` and ``tool_errors`` and says ``success``. The episode ends when
``done`` or after ``max_turns`` replies (the runner enforces the limit; the environment may
tell the model about it).

Environments are registered by name (:func:`register_env`) and made by name or by the
dotted path ``package.module.Class`` of user code (:func:`make_env`); an unknown name lists
the known ones; unknown constructor options are errors.
"""

from __future__ import annotations

import abc
import inspect
import random
from collections.abc import Callable
from typing import Any, NamedTuple

from ardea.agent.reply import Reply
from ardea.agent.tools import ToolBox
from ardea.errors import ConfigError
from ardea.registry import Registry, subclass_check

Message = dict[str, Any]


class StepResult(NamedTuple):
    """What :meth:`Environment.step` returns (gymnasium's order, with one ``done``)."""

    observation: list[Message]
    reward: float
    done: bool
    info: dict[str, Any]


class Environment(abc.ABC):
    """One episode at a time (module docstring). ``toolbox`` is None for an environment
    without tools; its tools are offered to the model through the chat template."""

    toolbox: ToolBox | None = None

    def __init__(self, *, max_turns: int = 4) -> None:
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ConfigError(f"agent.max_turns must be an int >= 1, got {max_turns!r}")
        self.max_turns = max_turns

    @classmethod
    @abc.abstractmethod
    def rows(cls, count: int, seed: int, *, split: str, **env_args: Any) -> list[dict[str, Any]]:
        """``count`` episodes' data for ``split`` (``train`` or ``eval``), reproducible from
        ``seed``; ``env_args`` are the constructor's options."""

    @abc.abstractmethod
    def reset(self, row: dict[str, Any]) -> list[Message]:
        """Start the episode of ``row``: the first messages of the conversation."""

    @abc.abstractmethod
    def step(self, reply: Reply) -> StepResult:
        """The model replied ``reply`` (its text, with its parsed tool calls): what it sees
        next, the reward, whether it is over."""

    def demonstration(self, row: dict[str, Any], rng: random.Random) -> list[Message]:
        """A demonstration episode of ``row`` (its whole conversation, for SFT before RL);
        environments that have no scripted player raise."""
        raise ConfigError(
            f"environment {type(self).__name__} has no demonstrations; SFT on an agent.env "
            "needs one that implements demonstration(row, rng), or SFT data in data.path"
        )

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The tools' schemas for ``tools=`` of the chat completion (None: no tools)."""
        return self.toolbox.schemas if self.toolbox is not None else None

    def run_tools(self, reply: Reply) -> StepResult | None:
        """If ``reply`` calls tools: run each call its parser found (a malformed one, an
        unknown tool, a failure become the tool's reply) and return the ``tool`` messages as
        a not-done step; None when it calls none."""
        if not isinstance(reply, Reply):
            raise TypeError(
                f"run_tools takes the Reply that step() was given (its calls are parsed "
                f"once, by agent.tool_parser), got {type(reply).__name__}"
            )
        calls = reply.tool_calls
        if not calls:
            return None
        box = self.toolbox or ToolBox({})
        results = [box.run(call) for call in calls]
        messages = [{"role": "tool", "content": r.content} for r in results]
        errors = sum(r.error is not None for r in results)
        return StepResult(messages, 0.0, False, {"tool_calls": len(calls), "tool_errors": errors})


EnvClass = type[Environment]
ENVIRONMENTS: Registry[EnvClass] = Registry(
    "environment",
    "environments",
    field="agent.env",
    check=subclass_check(Environment, "ardea.agent.Environment"),
)


def register_env(name: str) -> Callable[[EnvClass], EnvClass]:
    """Class decorator registering an environment as ``agent.env=<name>``."""
    return ENVIRONMENTS.register(name)


def env_class(name: str) -> EnvClass:
    """The environment class ``name``: a registered name or a dotted path to a class."""
    return ENVIRONMENTS.get(name)


def check_env_args(name: str, env_args: dict[str, Any]) -> None:
    """Raise ConfigError naming options ``env_args`` has that the environment does not take."""
    params = inspect.signature(env_class(name).__init__).parameters
    unknown = sorted(set(env_args) - set(params) - {"self"})
    if unknown:
        options = ", ".join(p for p in params if p not in ("self", "max_turns"))
        raise ConfigError(
            f"agent.env_args has unknown option(s) {unknown} for environment {name!r}; "
            f"it takes: {options or 'none'} (max_turns is agent.max_turns)"
        )


def make_env(name: str, *, max_turns: int, **env_args: Any) -> Environment:
    """A fresh environment ``name`` (checked options, :func:`check_env_args`)."""
    check_env_args(name, env_args)
    return env_class(name)(max_turns=max_turns, **env_args)

"""Tool calling: parse the model's calls, run registered Python tools with a timeout.

The model calls a tool in its chat template's tool format, one
``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`` per call (Hermes/Qwen style,
the format of ardea's tiny chat template). :func:`parse_tool_calls` finds them;
:class:`ToolBox` runs them. Nothing a model writes can crash a rollout: a malformed call,
an unknown tool, a tool that raises and one that runs past its timeout each become a
:class:`ToolResult` with ``error`` set, whose text the model sees as the tool's reply, and
are counted (``tool_errors``). A tool whose sandbox process dies (``executor: process``: it
ended without an answer, e.g. killed or crashed in native code) is not the model's mistake
but the infrastructure's: :class:`ToolSandboxError` is raised, and the episode runner ends
that episode as an environment failure (left out of training under ``reward.on_error:
mask`` and counted in ``agent/env_failures``, or the run stops under ``fail``).

Tools are plain Python callables taking keyword arguments and returning something
``str()`` can show. Their OpenAI-style schema (for ``tools=`` of the chat template) is
built from the signature: every parameter a string unless annotated ``int``/``float``/
``bool``.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ardea.config.reward import EXECUTORS
from ardea.errors import ArdeaError
from ardea.reward.isolation import call_in_process

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}


class ToolSandboxError(ArdeaError):
    """A tool's sandbox process died: an infrastructure failure (module docstring)."""


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: ``name`` and ``arguments``, or ``error`` when it was malformed."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None


@dataclass(frozen=True)
class ToolResult:
    """What a call returned (``content``) or why it failed (``error``, then ``content`` is
    the error text shown to the model)."""

    name: str
    content: str
    error: str | None = None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The ``<tool_call>`` blocks of ``text`` in order; one whose body is not a JSON object
    with a string ``name`` and an object ``arguments`` is a call with ``error`` set."""
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            calls.append(ToolCall("", {}, f"malformed tool call (not JSON: {exc.msg})"))
            continue
        name = payload.get("name") if isinstance(payload, dict) else None
        args = payload.get("arguments", {}) if isinstance(payload, dict) else None
        if not isinstance(name, str) or not isinstance(args, dict):
            calls.append(ToolCall("", {}, 'malformed tool call (needs {"name", "arguments"})'))
        else:
            calls.append(ToolCall(name, args))
    if "<tool_call>" in text and text.count("<tool_call>") > len(calls):
        calls.append(ToolCall("", {}, "malformed tool call (unclosed <tool_call>)"))
    return calls


def tool_schema(name: str, fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI function-tool schema of ``fn`` (module docstring)."""
    properties, required = {}, []
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: describe it as a string
        hints = {}
    for param in inspect.signature(fn).parameters.values():
        properties[param.name] = {"type": _JSON_TYPES.get(hints.get(param.name), "string")}
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    doc = (inspect.getdoc(fn) or "").split("\n")[0]
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": doc, "parameters": parameters},
    }


class ToolBox:
    """Registered tools run with a per-call timeout (module docstring).

    Args:
        tools: name → callable.
        timeout: seconds one call may run; a call past it is reported as timed out.
        executor: ``thread`` (the call's thread is left to finish: Python cannot kill it)
            or ``process`` (each call in a forked child, killed at the timeout; a tool that
            ends its process is a failed call: :mod:`ardea.reward.isolation`).
    """

    def __init__(
        self,
        tools: Mapping[str, Callable[..., Any]],
        *,
        timeout: float = 5.0,
        executor: str = "thread",
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"tool timeout must be > 0 seconds, got {timeout!r}")
        if executor not in EXECUTORS:
            raise ValueError(f"tool executor {executor!r}; choose {', '.join(EXECUTORS)}")
        self.tools = dict(tools)
        self.timeout = float(timeout)
        self.executor = executor
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="ardea-tool")

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tools' schemas, for ``tools=`` of the chat template and the OpenAI API."""
        return [tool_schema(name, fn) for name, fn in self.tools.items()]

    def run(self, call: ToolCall) -> ToolResult:
        """Run one parsed call; every failure is a result with ``error`` set."""
        if call.error is not None:
            return ToolResult(call.name, f"error: {call.error}", call.error)
        fn = self.tools.get(call.name)
        if fn is None:
            known = ", ".join(sorted(self.tools)) or "none"
            error = f"unknown tool {call.name!r} (tools: {known})"
            return ToolResult(call.name, f"error: {error}", error)
        if self.executor == "process":
            return self._run_in_process(call, fn)
        future = self._pool.submit(fn, **call.arguments)
        try:
            value = future.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            error = f"tool {call.name!r} timed out after {self.timeout:g} s"
            return ToolResult(call.name, f"error: {error}", error)
        except Exception as exc:  # a tool's failure is the model's observation, not a crash
            error = f"tool {call.name!r} failed: {type(exc).__name__}: {exc}"
            return ToolResult(call.name, f"error: {error}", error)
        return ToolResult(call.name, str(value))

    def _run_in_process(self, call: ToolCall, fn: Callable[..., Any]) -> ToolResult:
        outcome = call_in_process(fn, (), call.arguments, timeout_s=self.timeout)
        if outcome.status == "ok":
            return ToolResult(call.name, str(outcome.value))
        if outcome.status == "died":
            raise ToolSandboxError(
                f"tool {call.name!r}: {outcome.error}; its sandbox failed, not the model"
            )
        if outcome.status == "timeout":
            error = (
                f"tool {call.name!r} timed out after {self.timeout:g} s (its process was killed)"
            )
        else:
            error = f"tool {call.name!r} failed: {outcome.error}"
        return ToolResult(call.name, f"error: {error}", error)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

"""Tool-call formats by name: how each model family writes a call in its reply.

``agent.tool_parser`` (and ``RecordingClient(tool_parser=...)``) names one; the names are
those vLLM's ``--tool-call-parser`` accepts for the same models:

- ``hermes`` (Hermes, Qwen 2.5/3, ardea's tiny template): ``<tool_call>{"name": ...,
  "arguments": {...}}</tool_call>`` per call;
- ``llama3_json`` (Llama 3.1–3.3): a JSON object ``{"name": ..., "parameters": {...}}``
  (or ``"arguments"``), optionally after ``<|python_tag|>``, several separated by ``;``;
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}`` (older
  tokenizers) or ``name[ARGS]{...}`` per call (v11+ tokenizers);
- ``deepseek_v3``: ``<｜tool▁calls▁begin｜>`` then per call ``<｜tool▁call▁begin｜>function
  <｜tool▁sep｜>NAME`` and the arguments in a ```` ```json ```` block, ``<｜tool▁call▁end｜>``;
- or a dotted path ``package.module.Class`` to a :class:`ToolParser` subclass.

``auto`` picks one from the tokenizer's chat template when exactly one family's markers are
in it, and is an error naming the choices otherwise. A parser returns the calls in order
(a malformed one with ``error`` set: the model sees the error, the rollout goes on) and the
text without the well-formed calls (the message content).
"""

from __future__ import annotations

import importlib
import json
import re
from typing import Any

from ardea.agent.tools import ToolCall, parse_tool_calls
from ardea.errors import ConfigError


class ToolParser:
    """Finds a model family's tool calls in a reply's text (module docstring)."""

    name = "base"
    markers: tuple[str, ...] = ()  # what its chat templates contain (for ``auto``)
    end = ""  # the text ending one call (``parallel_tool_calls=False`` cuts after it)

    def parse(self, text: str) -> tuple[list[ToolCall], str]:
        """``(calls, content)``: the calls in order and the text without the good ones."""
        raise NotImplementedError


class Hermes(ToolParser):
    name, markers, end = "hermes", ("<tool_call>",), "</tool_call>"
    BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text):
        calls = parse_tool_calls(text)
        good = [c for c in calls if c.error is None]
        return calls, self.BLOCK.sub("", text) if good else text


def _call(payload: Any, keys=("arguments", "parameters")) -> ToolCall:
    """A call from a decoded JSON object ``{"name", "arguments" | "parameters"}``."""
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return ToolCall("", {}, 'malformed tool call (needs {"name", "arguments"})')
    args = next((payload[k] for k in keys if k in payload), {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    if not isinstance(args, dict):
        return ToolCall(
            "", {}, f"malformed tool call {payload['name']!r} (arguments not an object)"
        )
    return ToolCall(payload["name"], args)


def _json_values(text: str) -> tuple[list[Any], str] | None:
    """The JSON values that make up ``text`` (separated by ``;`` or whitespace), or None
    when anything else is in it."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and text[at] in " \t\n;":
            at += 1
        if at == len(text):
            return values, ""
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return None
        values.append(value)


class Llama3Json(ToolParser):
    name, markers, end = "llama3_json", ("<|python_tag|>",), ""
    TAG = "<|python_tag|>"

    def parse(self, text):
        body = text.split(self.TAG, 1)[1] if self.TAG in text else text
        stripped = body.strip()
        if not stripped.startswith("{"):
            return [], text
        found = _json_values(stripped)
        if found is None or not found[0]:
            if self.TAG in text:
                return [
                    ToolCall("", {}, "malformed tool call (not JSON after <|python_tag|>)")
                ], text
            return [], text
        calls = [_call(v) for v in found[0]]
        if all(c.error for c in calls) and self.TAG not in text:
            return [], text  # JSON that is not a call: a plain answer
        return calls, text.split(self.TAG, 1)[0] if self.TAG in text else ""


class Mistral(ToolParser):
    name, markers, end = "mistral", ("[TOOL_CALLS]",), ""
    TAG = "[TOOL_CALLS]"

    def parse(self, text):
        if self.TAG not in text:
            return [], text
        content, _, body = text.partition(self.TAG)
        body = body.strip()
        if body.startswith("["):
            found = _json_values(body)
            if found is None or len(found[0]) != 1 or not isinstance(found[0][0], list):
                return [
                    ToolCall("", {}, "malformed tool call (not a JSON list after [TOOL_CALLS])")
                ], text
            return [_call(v) for v in found[0][0]], content
        calls = []
        for part in body.split(self.TAG):  # v11+: name[ARGS]{...} per call
            name, sep, args = part.partition("[ARGS]")
            try:
                payload = json.loads(args) if sep else None
            except json.JSONDecodeError:
                payload = None
            calls.append(_call({"name": name.strip(), "arguments": payload})
                         if isinstance(payload, dict) and name.strip()
                         else ToolCall("", {}, "malformed tool call (needs NAME[ARGS]{...})"))  # fmt: skip
        return calls, content


class DeepSeekV3(ToolParser):
    name, markers, end = "deepseek_v3", ("<｜tool▁calls▁begin｜>",), "<｜tool▁call▁end｜>"
    BEGIN, SEP = "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>"
    CALL = re.compile(
        r"<｜tool▁call▁begin｜>(?P<kind>\w+)<｜tool▁sep｜>(?P<name>[^\n]+)\n```json\n"
        r"(?P<args>.*?)\n```<｜tool▁call▁end｜>",
        re.DOTALL,
    )

    def parse(self, text):
        if self.BEGIN not in text:
            return [], text
        content, _, body = text.partition(self.BEGIN)
        calls = []
        for m in self.CALL.finditer(body):
            try:
                calls.append(_call({"name": m["name"].strip(), "arguments": json.loads(m["args"])}))
            except json.JSONDecodeError as exc:
                calls.append(
                    ToolCall("", {}, f"malformed tool call (arguments not JSON: {exc.msg})")
                )
        if not calls:
            calls.append(ToolCall("", {}, "malformed tool call (no call after the begin marker)"))
        return calls, content


TOOL_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (Hermes, Llama3Json, Mistral, DeepSeekV3)
}


def make_tool_parser(name: str, tokenizer: Any = None) -> ToolParser:
    """The parser named ``name`` (a registered name, ``auto`` or a dotted path)."""
    if name == "auto":
        return TOOL_PARSERS[detect_tool_parser(tokenizer)]()
    if name in TOOL_PARSERS:
        return TOOL_PARSERS[name]()
    if "." not in name:
        raise ConfigError(
            f"agent.tool_parser={name!r}: choose {', '.join(TOOL_PARSERS)}, auto, or a dotted "
            "path package.module.Class to an ardea.agent.ToolParser subclass"
        )
    module, _, attr = name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"agent.tool_parser={name!r} cannot be imported: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, ToolParser)):
        raise ConfigError(f"agent.tool_parser={name!r} is not an ardea.agent.ToolParser subclass")
    return cls()


def detect_tool_parser(tokenizer: Any) -> str:
    """The one family whose markers the tokenizer's chat template holds (module docstring)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if not isinstance(template, str):  # several named templates: look at all of them
        template = " ".join(str(t) for t in dict(template).values())
    found = [n for n, p in TOOL_PARSERS.items() if any(m in template for m in p.markers)]
    if len(found) != 1:
        seen = f"its markers for {found}" if found else "no known tool-call markers"
        raise ConfigError(
            f"agent.tool_parser=auto: the chat template holds {seen}; name one of "
            f"{', '.join(TOOL_PARSERS)} or a dotted path"
        )
    return found[0]

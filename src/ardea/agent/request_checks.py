"""Checking a chat-completions request before anything is tokenised or generated.

Every problem is a :class:`RequestError` naming the field as OpenAI does (``param``:
``messages[2].tool_call_id``, ``tools[0].function``, ``max_tokens``, ...); over HTTP it is a
4xx with the OpenAI error body ``{"error": {"message", "type", "param", "code"}}``. The
checks return the request in the form the client reads: message contents as strings (a
list of ``text`` parts joined), ``stop`` as a list, ``tool_choice`` as ``auto``, ``none``,
``required`` or a tool name.

Options that change nothing on a local server that records every call (``store``,
``service_tier``, ``prompt_cache_key``, ``safety_identifier``) are accepted; penalties and
``logit_bias`` only at their neutral values; anything else unknown is an error naming it.

Before any of that, :func:`check_json` walks the whole body once, without recursion: a
value nested deeper than ``MAX_DEPTH`` levels, or a string holding a lone UTF-16 surrogate
(valid JSON, ``"\\ud800"``, but not text any tokenizer can encode), is an error naming
where it is. Integers are 64-bit (``seed``, ``max_tokens``, ``n``: larger is an error);
values quoted in messages are cut to ``SHOWN`` characters.
"""

from __future__ import annotations

import math
import reprlib
from typing import Any

from ardea.errors import ArdeaError

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 16
MAX_CHOICES = 16
MAX_DEPTH = 64  # JSON nesting: tool schemas go a few levels deep, nothing legitimate to 64
MAX_INT = 2**63 - 1  # integers are 64-bit, as OpenAI's API and the engines' seeds take them
SHOWN = 80  # characters of a value quoted in an error message
NO_EFFECT = ("store", "service_tier", "prompt_cache_key", "safety_identifier")
NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {}, "top_logprobs": 0}
OPTIONS = ("messages", "model", "tools", "temperature", "top_p", "max_tokens",
           "max_completion_tokens", "seed", "logprobs", "n", "stream", "stream_options",
           "tool_choice", "parallel_tool_calls", "stop", "metadata", "user", *NO_EFFECT,
           *NEUTRAL)  # fmt: skip


class RequestError(ArdeaError):
    """A request the server refuses (module docstring): ``status`` (400, 404, 413),
    ``kind`` (the OpenAI error ``type``), ``param`` and ``code``."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        code: str | None = None,
        kind: str = "invalid_request_error",
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.param, self.status, self.code, self.kind = param, status, code, kind
        self.detail = message if detail is None else detail  # the message without the param

    def renamed(self, param: str | None) -> RequestError:
        """The same refusal naming the field ``param`` (another API's name for it)."""
        message = f"{param}: {self.detail}" if param else self.detail
        return RequestError(message, param=param, status=self.status, code=self.code,
                            kind=self.kind, detail=self.detail)  # fmt: skip

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.code}}  # fmt: skip


class UnsupportedOption(RequestError, TypeError):
    """An option the client does not take (a TypeError in process, like an unexpected
    keyword argument of the ``openai`` client)."""


def fail(param: str | None, message: str, **kw: Any) -> RequestError:
    return RequestError(
        f"{param}: {message}" if param else message, param=param, detail=message, **kw
    )


_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = SHOWN
_repr.maxlevel = 3


def shown(value: Any) -> str:
    """``repr(value)`` cut short (a user's value quoted in an error, whatever its size)."""
    return _repr.repr(value)


def check_json(value: Any, at: str = "") -> None:
    """Walk a decoded JSON value iteratively (module docstring): nesting at most
    ``MAX_DEPTH``, no lone surrogate in a string or key; errors name the path (``at``
    prefixes it)."""
    stack = [(value, at, 1)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH and isinstance(item, dict | list):
            raise fail(path or None, f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, dict):
            for key, child in item.items():
                shown_key = str(key).encode("utf-8", "backslashreplace").decode()
                name = f"{path}.{shown_key}" if path else shown_key
                if isinstance(key, str):
                    _check_text(key, f"{name} (the key)")
                stack.append((child, name, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))


def _check_text(text: str, at: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise fail(at or None, f"holds a lone surrogate U+{ord(bad):04X} at character "
                   f"{exc.start}: not valid Unicode text (encode text as UTF-8)") from None  # fmt: skip


def check_known(options: Any, known: tuple[str, ...], call: str, *, at: str = "") -> None:
    """``options`` (the body, or its field ``at``) is an object of ``known`` options only
    (``call`` names the API)."""
    if not isinstance(options, dict):
        where = "must be" if at else "the request body must be"
        raise fail(at or None, f"{where} a JSON object, got {shown(options)}")
    unknown = sorted(set(options) - set(known), key=str)
    if unknown:
        prefix = f"{at}." if at else ""
        raise UnsupportedOption(
            f"{call}() got unsupported option(s) {shown(unknown)}; supported: {', '.join(known)}",
            param=f"{prefix}{unknown[0]}",
        )


def check_chat_request(options: dict[str, Any]) -> dict[str, Any]:
    """The checked request (module docstring); a :class:`RequestError` naming the field."""
    check_known(options, OPTIONS, "chat.completions.create")
    check_json(options)
    for name, neutral in NEUTRAL.items():
        if options.get(name) not in (None, neutral):
            raise UnsupportedOption(
                f"{name}={shown(options[name])} is not supported (only {shown(neutral)}): the reply "
                "would not be what the request asked for",
                param=name,
            )
    out = dict(options)
    if "messages" not in options:
        raise fail("messages", "is required")
    out["messages"] = check_messages(options["messages"])
    out["tools"] = check_tools(options.get("tools"))
    out["tool_choice"] = check_tool_choice(options.get("tool_choice"), out["tools"])
    for name in ("max_tokens", "max_completion_tokens", "seed", "n"):
        _int(options, name, low=0 if name == "seed" else 1)
    if options.get("n") is not None and options["n"] > MAX_CHOICES:
        raise fail("n", f"{options['n']} choices; at most {MAX_CHOICES}")
    _number(options, "temperature", low=0.0, high=2.0)
    _number(options, "top_p", low=0.0, high=1.0, open_low=True)
    for name in ("logprobs", "stream", "parallel_tool_calls"):
        if options.get(name) is not None and not isinstance(options[name], bool):
            raise fail(name, f"must be true or false, got {shown(options[name])}")
    for name in ("model", "user"):
        if options.get(name) is not None and not isinstance(options[name], str):
            raise fail(name, f"must be a string, got {shown(options[name])}")
    out["stop"] = check_stop(options.get("stop"))
    metadata = options.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise fail("metadata", f"must be an object of strings, got {shown(metadata)}")
        for key, value in metadata.items():
            if not isinstance(value, str):
                raise fail(f"metadata.{key}", f"must be a string, got {shown(value)}")
    return out


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """Each message checked, its content a string; a tool message must answer a tool call
    of an earlier assistant message (by ``tool_call_id``)."""
    if not isinstance(messages, list):
        raise fail("messages", f"must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise fail("messages", "is empty")
    out, calls = [], set()
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if hasattr(m, "model_dump"):
            m = m.model_dump(exclude_none=True)
        if not isinstance(m, dict):
            raise fail(at, f"must be an object with role and content, got {shown(m)}")
        role = m.get("role")
        if role not in ROLES:
            raise fail(f"{at}.role", f"{shown(role)} is not a role; one of {', '.join(ROLES)}")
        m = {**m, "content": text_content(m.get("content"), f"{at}.content")}
        if role == "assistant":
            for j, call in enumerate(as_list(m.get("tool_calls"), f"{at}.tool_calls")):
                calls.add(_check_call(call, f"{at}.tool_calls[{j}]"))
        if role == "tool":
            answered = m.get("tool_call_id")
            if not isinstance(answered, str) or not answered:
                raise fail(
                    f"{at}.tool_call_id", "a tool message needs the id of the call it answers"
                )
            if answered not in calls:
                raise fail(f"{at}.tool_call_id", f"{shown(answered)} answers no earlier tool call")
        out.append(m)
    return out


def text_content(content: Any, at: str) -> str:
    """A message content as text: a string, null, or a list of ``text`` parts joined."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise fail(at, f"must be a string or a list of text parts, got {shown(content)}")
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("text", "input_text", "output_text"):
            raise fail(
                f"{at}[{k}].type", f"content part type {shown(kind)} is not supported (text only)"
            )
        if not isinstance(part.get("text"), str):
            raise fail(f"{at}[{k}].text", f"must be a string, got {shown(part.get('text'))}")
        texts.append(part["text"])
    return "".join(texts)


def _check_call(call: Any, at: str) -> str:
    if not isinstance(call, dict):
        raise fail(at, f"must be an object, got {shown(call)}")
    f = call.get("function")
    if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
        raise fail(f"{at}.function.name", "a tool call needs a function name")
    if not isinstance(f.get("arguments", ""), str | dict):
        raise fail(
            f"{at}.function.arguments", f"must be a JSON string, got {shown(f['arguments'])}"
        )
    return str(call.get("id") or "")


def check_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Function tools ``{"type": "function", "function": {"name", "parameters"?}}``."""
    for i, tool in enumerate(as_list(tools, "tools")):
        at = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise fail(f"{at}.type", f"{shown(kind)}: only function tools are supported")
        f = tool.get("function")
        if not isinstance(f, dict):
            raise fail(f"{at}.function", "a function tool needs a function object")
        if not isinstance(f.get("name"), str) or not f["name"]:
            raise fail(
                f"{at}.function.name", f"must be a non-empty string, got {shown(f.get('name'))}"
            )
        if not isinstance(f.get("parameters", {}), dict):
            raise fail(f"{at}.function.parameters", "must be a JSON schema object")
    return tools or None


def check_tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> str:
    """``auto`` (the default: a well-formed tool-call block is a call, tools given or not),
    ``none``, ``required`` or the name of a function to call."""
    if choice is None:
        return "auto"
    if isinstance(choice, dict):
        name = (
            (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        )
        if not isinstance(name, str):
            raise fail("tool_choice", f'{shown(choice)}; a named choice is {{"type": "function", '
                       '"function": {"name": ...}}')  # fmt: skip
        choice = name
    elif choice not in ("auto", "none", "required"):
        raise fail(
            "tool_choice", f"{shown(choice)}; one of auto, none, required or a named function"
        )
    names = [t["function"]["name"] for t in tools or []]
    if choice not in ("auto", "none") and not names:
        raise fail("tool_choice", f"{shown(choice)} is only allowed when tools are given")
    if choice not in ("auto", "none", "required") and choice not in names:
        raise fail("tool_choice", f"names function {shown(choice)}, not one of the tools {names}")
    return choice


def check_stop(stop: Any) -> list[str]:
    """``stop``: a string or a list of up to 16 non-empty strings."""
    stops = [stop] if isinstance(stop, str) else as_list(stop, "stop")
    if len(stops) > MAX_STOP:
        raise fail("stop", f"{len(stops)} sequences; at most {MAX_STOP}")
    for s in stops:
        if not isinstance(s, str) or not s:
            raise fail("stop", f"each stop sequence must be a non-empty string, got {shown(s)}")
    return list(stops)


def as_list(value: Any, at: str) -> list[Any]:
    """``value`` (at ``at``) as a list: None is empty, anything else but a list an error."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise fail(at, f"must be a list, got {shown(value)}")
    return value


def _int(options: dict[str, Any], name: str, *, low: int) -> None:
    value = options.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_INT:
        raise fail(name, f"must be an integer in [{low}, 2**63 - 1], got {shown(value)}")


def _number(options, name, *, low: float, high: float, open_low: bool = False) -> None:
    value = options.get(name)
    if value is None:
        return
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value > high or value < low or (open_low and value == low):
        bound = f"({low:g}, {high:g}]" if open_low else f"[{low:g}, {high:g}]"
        raise fail(name, f"must be a number in {bound}, got {shown(value)}")


def check_reward(body: Any) -> tuple[str, float, int | None]:
    """``/v1/rewards``: ``{"completion_id": str, "reward": finite number, "choice"?: int}``."""
    if not isinstance(body, dict):
        raise fail(None, "the body must be a JSON object with completion_id and reward")
    check_json(body)
    cid, reward, choice = body.get("completion_id"), body.get("reward"), body.get("choice")
    if not isinstance(cid, str) or not cid:
        raise fail("completion_id", f"must be the id of a completion, got {shown(cid)}")
    ok = isinstance(reward, int | float) and not isinstance(reward, bool)
    if not ok or not math.isfinite(reward):
        raise fail("reward", f"must be a finite number, got {shown(reward)}")
    if choice is not None and (isinstance(choice, bool) or not isinstance(choice, int)):
        raise fail("choice", f"must be the index of a choice, got {shown(choice)}")
    return cid, float(reward), choice

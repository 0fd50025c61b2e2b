"""``POST /v1/responses``: the subset of OpenAI's Responses API that agent SDKs use (the
OpenAI Agents SDK's default model), served and recorded as chat completions.

A request becomes chat messages: ``instructions`` a system message; ``input`` a string (one
user message) or items: messages (text parts), ``function_call`` items (the assistant's
tool calls: consecutive ones join the assistant message before them) and
``function_call_output`` items (tool messages); ``previous_response_id`` puts that
response's messages and output first. Function tools, ``tool_choice``,
``max_output_tokens``, ``temperature``, ``top_p``, ``parallel_tool_calls``, ``metadata``
and ``user`` map to their chat options (log-probs are on the chat-completions route); other
item, tool and option types are errors naming them. The reply is a ``Response`` whose output
is a ``message`` item (when there is text) and one ``function_call`` item per tool call;
``stream=True`` sends it as the API's events (created, in_progress, each item's added /
delta / done events, completed), each a server-sent event with its ``event:`` name.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from openai.types.chat import ChatCompletion
from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseUsage,
)

from ardea.agent.request_checks import (
    RequestError,
    check_json,
    check_known,
    fail,
    shown,
    text_content,
)

OPTIONS = ("model", "input", "instructions", "tools", "tool_choice", "max_output_tokens",
           "temperature", "top_p", "parallel_tool_calls", "stream", "metadata", "user",
           "previous_response_id", "store", "include", "text", "reasoning", "truncation",
           "service_tier", "prompt_cache_key", "safety_identifier", "background",
           "top_logprobs")  # fmt: skip
_NUMBER = (int, float)
TYPES: dict[str, tuple[type, ...]] = {  # what each field may be besides null
    **dict.fromkeys(("model", "instructions", "previous_response_id", "user", "truncation",
                     "service_tier", "prompt_cache_key", "safety_identifier"), (str,)),
    **dict.fromkeys(("stream", "store", "background", "parallel_tool_calls"), (bool,)),
    **dict.fromkeys(("metadata", "text", "reasoning"), (dict,)),
    **dict.fromkeys(("tools", "include"), (list,)),
    "input": (str, list), "tool_choice": (str, dict),
    "max_output_tokens": (int,), "top_logprobs": (int,),
    "temperature": _NUMBER, "top_p": _NUMBER,
}  # fmt: skip
_KINDS = {str: "a string", bool: "true or false", dict: "an object", list: "a list",
          int: "an integer", float: "a number"}  # fmt: skip
INCLUDES = ("reasoning.encrypted_content",)  # nothing to include: no reasoning items
ROLES = ("user", "assistant", "system", "developer")
SAME = ("model", "temperature", "top_p", "parallel_tool_calls", "metadata", "user")
RENAMED = {"messages": "input", "max_tokens": "max_output_tokens"}  # chat name → Responses
_MESSAGE_PARAM = re.compile(r"messages\[(\d+)\](?:\.tool_calls\[(\d+)\])?(.*)")
_CALL_FIELDS = {".function.name": ".name", ".function.arguments": ".arguments",
                ".function": ""}  # fmt: skip
_FIELDS = {".tool_call_id": ".call_id"}


@dataclass
class ResponsesRequest:
    """A Responses request as chat-completions ``options``, whether it streams, and where
    each chat message came from (``origins[k]``: the Responses field of ``messages[k]``;
    ``call_origins[(k, j)]``: of its tool call ``j``), to name Responses fields in errors."""

    options: dict[str, Any]
    stream: bool
    origins: list[str] = field(default_factory=list)
    call_origins: dict[tuple[int, int], str] = field(default_factory=dict)

    def renamed(self, exc: RequestError) -> RequestError:
        """``exc`` (raised on the chat options) naming the Responses field instead."""
        param = exc.param
        if param is None:
            return exc
        found = _MESSAGE_PARAM.fullmatch(param)
        if found is not None:
            k, j, rest = int(found[1]), found[2], found[3]
            if j is not None and (k, int(j)) in self.call_origins:
                return exc.renamed(self.call_origins[k, int(j)] + _CALL_FIELDS.get(rest, rest))
            origin = self.origins[k] if k < len(self.origins) else "input"
            if origin.startswith("input[") and rest == ".content" and self._is_output(k):
                rest = ".output"
            return exc.renamed(origin + _FIELDS.get(rest, rest))
        top, dot, rest = param.partition(".")
        if top == "tools" or param.startswith("tools["):
            return exc.renamed(param.replace(".function", "", 1))
        return exc.renamed(RENAMED.get(top, top) + dot + rest) if top in RENAMED else exc

    def _is_output(self, k: int) -> bool:
        return self.options["messages"][k]["role"] == "tool"


def chat_request(body: Any, earlier: Callable[[str], list[dict[str, Any]]]) -> ResponsesRequest:
    """The chat-completions options of a Responses request (module docstring);
    ``earlier(response_id)`` gives a stored response's messages."""
    check_known(body, OPTIONS, "responses.create")
    check_json(body)
    _check_types(body)
    _check_neutral(body)
    converted = ResponsesRequest({}, bool(body.get("stream")))
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
        converted.origins.append("instructions")
    if body.get("previous_response_id") is not None:
        before = [m for m in earlier(body["previous_response_id"]) if m["role"] != "system"]
        messages += before
        converted.origins += ["previous_response_id"] * len(before)
    if "input" not in body or body["input"] is None:
        raise fail("input", "is required")
    input_messages(body["input"], messages, converted)
    options = {k: body[k] for k in SAME if body.get(k) is not None}
    options.update(messages=messages, max_tokens=body.get("max_output_tokens"))
    options["tools"] = [_chat_tool(t, i) for i, t in enumerate(body.get("tools") or [])] or None
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    options["tool_choice"] = choice
    for i, entry in enumerate(body.get("include") or []):
        if entry not in INCLUDES:
            raise fail(f"include[{i}]", f"{shown(entry)} is not supported; one of "
                       f"{', '.join(INCLUDES)}")  # fmt: skip
    converted.options = {k: v for k, v in options.items() if v is not None}
    return converted


def _check_types(body: dict[str, Any]) -> None:
    """Each field of ``body`` null or of its type (``TYPES``); a bool is not a number."""
    for name, kinds in TYPES.items():
        value = body.get(name)
        if value is None:
            continue
        bad_bool = isinstance(value, bool) and bool not in kinds
        if bad_bool or not isinstance(value, kinds):
            want = " or ".join(_KINDS[k] for k in kinds)
            raise fail(name, f"must be {want}, got {shown(value)}")


def input_messages(items: Any, messages: list[dict[str, Any]], converted: ResponsesRequest):
    """Append the chat messages of ``input`` to ``messages`` (module docstring), noting
    each one's origin in ``converted``."""
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        converted.origins.append("input")
        return
    for i, item in enumerate(items):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            raise fail(at, f"must be an input item object, got {shown(item)}")
        kind = item.get("type", "message")
        if kind == "message":
            if item.get("role") not in ROLES:
                raise fail(f"{at}.role", f"{shown(item.get('role'))} is not a role; one of "
                           f"{', '.join(ROLES)}")  # fmt: skip
            content = text_content(item.get("content"), f"{at}.content")
            messages.append({"role": item["role"], "content": content})
            converted.origins.append(at)
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise fail(f"{at}.{key}", f"a function_call item needs a string {key}")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}  # fmt: skip
            if not (messages and messages[-1]["role"] == "assistant" and i > 0):
                messages.append({"role": "assistant", "content": ""})
                converted.origins.append(at)
            calls = messages[-1].setdefault("tool_calls", [])
            converted.call_origins[len(messages) - 1, len(calls)] = at
            calls.append(call)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise fail(
                    f"{at}.call_id", "a function_call_output item needs the call_id it answers"
                )
            output = item.get("output")
            content = output if isinstance(output, str) else text_content(output, f"{at}.output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
            converted.origins.append(at)
        else:
            raise fail(f"{at}.type", f"input item type {shown(kind)} is not supported "
                       "(message, function_call, function_call_output)")  # fmt: skip


def _chat_tool(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else tool
        raise fail(f"tools[{i}].type", f"{shown(kind)}: only function tools are supported")
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": function}


def _check_neutral(body: dict[str, Any]) -> None:
    """Options that would change the output: only their neutral values."""
    text = body.get("text") or {}
    check_known(text, ("format", "verbosity"), "responses.create text", at="text")
    fmt = text.get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise fail("text.format", f"must be an object, got {shown(fmt)}")
    if (fmt or {}).get("type", "text") != "text":
        raise fail("text.format", f"{shown(fmt)}: only plain text output is supported")
    if text.get("verbosity") not in (None, "medium"):
        raise fail("text.verbosity", f"{shown(text['verbosity'])}: only medium (the default)")
    reasoning = body.get("reasoning") or {}
    check_known(reasoning, ("effort", "summary", "generate_summary"), "responses.create "
                "reasoning", at="reasoning")  # fmt: skip
    for key, value in reasoning.items():
        if value is not None:
            raise fail(f"reasoning.{key}", f"{shown(value)}: reasoning options are not supported")
    if body.get("truncation") not in (None, "disabled"):
        raise fail("truncation", f"{shown(body['truncation'])}: only disabled (a prompt beyond "
                   "the context is an error)")  # fmt: skip
    if body.get("background"):
        raise fail("background", "background responses are not supported")
    if body.get("top_logprobs") not in (None, 0):
        raise fail("top_logprobs", "only the sampled token's log-prob is returned (0)")


def response_of(completion: ChatCompletion, response_id: str, body: dict[str, Any]) -> Response:
    """The ``Response`` of a chat completion (one choice)."""
    (choice,) = completion.choices
    message = choice.message
    output: list[Any] = []
    if message.content:
        text = ResponseOutputText(type="output_text", text=message.content, annotations=[])
        output.append(ResponseOutputMessage(
            id=f"msg_{completion.id[9:]}", type="message", role="assistant",
            status="completed", content=[text]))  # fmt: skip
    for call in message.tool_calls or []:
        output.append(ResponseFunctionToolCall(
            type="function_call", id=f"fc_{call.id[5:]}", call_id=call.id,
            name=call.function.name, arguments=call.function.arguments, status="completed"))  # fmt: skip
    usage = completion.usage
    cut = choice.finish_reason == "length"
    return Response(
        id=response_id, object="response", created_at=time.time(), model=completion.model,
        output=output, status="incomplete" if cut else "completed",
        incomplete_details={"reason": "max_output_tokens"} if cut else None,
        parallel_tool_calls=body.get("parallel_tool_calls", True),
        tool_choice=_tool_choice(body.get("tool_choice")), tools=[],
        instructions=body.get("instructions"), metadata=body.get("metadata"),
        temperature=body.get("temperature"), top_p=body.get("top_p"),
        usage=ResponseUsage(
            input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
            input_tokens_details=_zeros("input_tokens_details"),
            output_tokens_details=_zeros("output_tokens_details")),
    )  # fmt: skip


def _zeros(field: str) -> dict[str, int]:
    """Zero for every required count of a usage details model (its fields vary by version
    of the ``openai`` package: cached, cache-write, reasoning tokens)."""
    details = ResponseUsage.model_fields[field].annotation
    return {k: 0 for k, f in details.model_fields.items() if f.is_required()}


def _tool_choice(choice: Any) -> Any:
    return choice if choice in ("auto", "none", "required") or isinstance(choice, dict) else "auto"


def response_events(response: Response) -> Iterator[str]:
    """``response`` as the Responses API's server-sent events (module docstring)."""
    seq = iter(range(1_000_000))

    def event(kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": next(seq), **fields}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    started = response.model_copy(update={"status": "in_progress", "output": [], "usage": None})
    yield event("response.created", response=started.model_dump(mode="json"))
    yield event("response.in_progress", response=started.model_dump(mode="json"))
    for index, item in enumerate(response.output):
        done = item.model_dump(mode="json")
        if item.type == "message":
            text = item.content[0].text
            yield event("response.output_item.added", output_index=index,
                        item={**done, "status": "in_progress", "content": []})  # fmt: skip
            part = {"type": "output_text", "text": "", "annotations": []}
            where = {"item_id": item.id, "output_index": index, "content_index": 0}
            yield event("response.content_part.added", **where, part=part)
            yield event("response.output_text.delta", **where, delta=text, logprobs=[])
            yield event("response.output_text.done", **where, text=text, logprobs=[])
            yield event("response.content_part.done", **where, part={**part, "text": text})
        else:
            yield event("response.output_item.added", output_index=index,
                        item={**done, "status": "in_progress", "arguments": ""})  # fmt: skip
            where = {"item_id": item.id, "output_index": index}
            yield event("response.function_call_arguments.delta", **where, delta=item.arguments)
            yield event("response.function_call_arguments.done", **where, arguments=item.arguments)
        yield event("response.output_item.done", output_index=index, item=done)
    final = "response.incomplete" if response.status == "incomplete" else "response.completed"
    yield event(final, response=response.model_dump(mode="json"))


def output_messages(response: Response) -> list[dict[str, Any]]:
    """The assistant message ``response`` adds to a conversation (for
    ``previous_response_id``)."""
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    for item in response.output:
        if item.type == "message":
            message["content"] = item.content[0].text
        else:
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
            message.setdefault("tool_calls", []).append(call)
    return [message]

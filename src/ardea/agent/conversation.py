"""Turning a chat request into token ids by appending to the parent call's tokens.

A request's ``messages`` continue an earlier call (its parent) when they start with the
parent's messages followed by the reply the parent returned. The child's input ids are then
the parent's input + output tokens (never re-tokenized), followed by the tokens of the text
the chat template adds after the reply: the end of the assistant turn the model did not
generate itself (e.g. the ``\\n`` after ``<|im_end|>``, or the whole end marker when the
reply stopped at the length limit or at another stop token), the new messages and the
generation prompt. That text is found by rendering the template: with
``A = render(parent messages + reply)`` and ``C = render(child messages, generation
prompt)``, the template kept history iff ``C`` starts with ``A``, and the new text is
``C[len(A):]``. A template that rewrote history (``C`` does not start with ``A``, e.g. it
dropped a ``<think>`` block of the earlier reply) or an agent that changed the reply
before sending it back is a :class:`~ardea.agent.interaction.HistoryRewriteError` under
``history="error"``; under ``new_trajectory`` the call is tokenized from scratch and the
export starts a new trajectory there.

``history="keep_tokens"`` keeps the tokens the engine saw and produced whatever the template
does with earlier turns: the child's input is the parent's input + output tokens followed by
only the text the template adds *after an assistant turn* for the new messages
(:func:`appended_ids`: rendered after a placeholder assistant turn, the placeholder's own
rendering dropped). The engine then sees exactly what is trained and the conversation stays
one row; the trade-off is that at rollout the model sees its earlier turns as it generated
them, not as the template would re-render them (AReaL's and verl's token-in-token-out agent
loops do the same).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ardea.agent.interaction import Interaction, rewrite_error
from ardea.agent.stop_strings import cut_at
from ardea.agent.tool_parsers import Hermes, ToolParser
from ardea.agent.tools import ToolCall
from ardea.rollout.engine import Completion

Message = dict[str, Any]


def normalize(message: Any) -> Message:
    """A message as a plain dict with what the template and the comparison read: role,
    content (None → ""), tool calls as ``{"name", "arguments": dict}``, tool_call_id."""
    if hasattr(message, "model_dump"):
        message = message.model_dump(exclude_none=True)
    out: Message = {"role": message["role"], "content": message.get("content") or ""}
    calls = []
    for call in message.get("tool_calls") or []:
        f = call.get("function", call)
        args = f.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        calls.append({"name": f["name"], "arguments": args})
    if calls:
        out["tool_calls"] = calls
    if message.get("tool_call_id"):
        out["tool_call_id"] = message["tool_call_id"]
    return out


def message_key(messages: Sequence[Message]) -> str:
    """A hashable key of normalized messages."""
    return json.dumps(list(messages), sort_keys=True, ensure_ascii=False)


def render(tokenizer: Any, messages: Sequence[Message], tools, *, generation: bool) -> str:
    """The chat template's text of ``messages`` (with ``tools``)."""
    return tokenizer.apply_chat_template(
        list(messages), tools=tools, tokenize=False, add_generation_prompt=generation
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def continuation_ids(
    tokenizer: Any,
    parent: Interaction,
    new_messages: Sequence[Message],
    tools,
    stop_texts: Sequence[str],
) -> list[int] | None:
    """The child's input ids appended to ``parent`` (module docstring), or None when the
    template rewrote history. ``parent.info`` holds its ``messages`` and ``reply``."""
    before = [*parent.info["messages"], parent.info["reply"]]
    rendered_parent = render(tokenizer, before, tools, generation=False)
    rendered_child = render(tokenizer, [*before, *new_messages], tools, generation=True)
    if not rendered_child.startswith(rendered_parent):
        return None
    glue = _turn_end(tokenizer, rendered_parent, parent, stop_texts)
    return parent.tokens + encode(tokenizer, glue + rendered_child[len(rendered_parent) :])


PLACEHOLDER = "ARDEA-KEPT-TURN-7f3a"  # stands for the parent's reply, whose tokens are kept


def appended_ids(
    tokenizer: Any,
    parent: Interaction,
    new_messages: Sequence[Message],
    tools,
    stop_texts: Sequence[str],
) -> list[int]:
    """``keep_tokens``: the parent's input + output tokens followed by the text the template
    adds after an assistant turn for ``new_messages`` (module docstring). The template
    renders a placeholder reply; what follows the placeholder is the end of the assistant
    turn (minus the stop token when the model generated it), the new messages and the
    generation prompt."""
    placeholder = {"role": "assistant", "content": PLACEHOLDER}
    context = [*parent.info["messages"], placeholder, *new_messages]
    rendered = render(tokenizer, context, tools, generation=True)
    after = rendered[rendered.rindex(PLACEHOLDER) + len(PLACEHOLDER) :]
    found = [(after.find(t), t) for t in stop_texts if after.find(t) >= 0]
    if not found:
        return parent.tokens + encode(tokenizer, after)
    at, marker = min(found)
    last = tokenizer.convert_ids_to_tokens(parent.output_ids[-1:]) if parent.output_ids else []
    generated_marker = parent.stop_reason == "stop" and last == [marker]
    glue = after[at + len(marker) :] if generated_marker else after[at:]
    return parent.tokens + encode(tokenizer, glue)


def _turn_end(tokenizer: Any, rendered: str, parent: Interaction, stop_texts) -> str:
    """The text after the reply's last generated token up to the end of ``rendered``: the
    template's turn end, minus the stop token when the model generated that one."""
    at, marker = max(((rendered.rfind(t), t) for t in stop_texts), default=(-1, ""))
    if at < 0:
        return ""
    last = tokenizer.convert_ids_to_tokens(parent.output_ids[-1:]) if parent.output_ids else []
    generated_marker = parent.stop_reason == "stop" and last == [marker]
    return rendered[at + len(marker) :] if generated_marker else rendered[at:]


@dataclass(frozen=True)
class Reply:
    """What a completion says as an assistant message: the decoded ``text`` (up to the stop
    token; tool-call blocks included), the normalized ``message`` (content without the
    well-formed tool-call blocks, which become ``tool_calls``) and those ``tool_calls``."""

    text: str
    message: Message
    tool_calls: list[ToolCall]


def assistant_reply(
    tokenizer: Any, completion: Completion, stop_ids: set[int], parser: ToolParser | None = None
) -> Reply:
    """The reply of ``completion`` (a stop token it ended with is not part of the text);
    tool calls found by ``parser`` (default ``hermes``)."""
    return reply_of(generated_text(tokenizer, completion, stop_ids), parser or Hermes())


def generated_text(tokenizer: Any, completion: Completion, stop_ids: set[int]) -> str:
    """The decoded text of ``completion`` without a stop token it ended with."""
    ids = completion.token_ids
    ended = completion.finish_reason == "stop" and ids and ids[-1] in stop_ids
    return tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)


def reply_of(text: str, parser: ToolParser | None) -> Reply:
    """The reply whose text is ``text``: the well-formed calls ``parser`` finds become
    ``tool_calls`` and leave the content (no parser, e.g. ``tool_choice="none"``: none)."""
    found, content = parser.parse(text) if parser is not None else ([], text)
    calls = [c for c in found if c.error is None]
    message: Message = {"role": "assistant", "content": content if calls else text}
    if calls:
        message["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in calls]
    return Reply(text, message, calls)


def stop_at(
    tokenizer: Any, completion: Completion, stop_ids: set[int], markers: Sequence[str], *,
    keep: bool,
) -> tuple[Completion, str] | None:  # fmt: skip
    """``completion`` cut after the token that completes the first of ``markers`` in its
    text, with that text (up to the marker, or through it when ``keep``); None when no
    marker occurs. The cut completion's finish reason is ``stop``."""
    ids = completion.token_ids
    ended = completion.finish_reason == "stop" and ids and ids[-1] in stop_ids
    cut = cut_at(tokenizer, ids[:-1] if ended else ids, markers, keep=keep)
    if cut is None:
        return None
    n, text = cut
    kept = dataclasses.replace(
        completion, token_ids=ids[:n], logprobs=completion.logprobs[:n], finish_reason="stop"
    )
    return kept, text


class Conversation:
    """One conversation played on an engine directly (the episode runner's core, without the
    OpenAI façade): it owns its messages and its calls (each an :class:`Interaction`
    continuing the one before) and gives the input ids of the next call, the last call's
    tokens followed by the template's continuation (module docstring).

    Args:
        tokenizer: its chat template renders the messages.
        messages: the first messages; ``tools``: the tools' schemas (or None).
        history: ``error`` (a template that rewrote history raises
            :class:`~ardea.agent.interaction.HistoryRewriteError`), ``new_trajectory``
            (that call is tokenized from scratch; the export starts a new row there) or
            ``keep_tokens`` (the earlier tokens are kept: :func:`appended_ids`).
        stop_ids: the engine's stop token ids; ``group_id``: the row it answers.
        tool_parser: finds the tool calls of each reply (default ``hermes``).
    """

    def __init__(
        self,
        tokenizer: Any,
        messages: Sequence[Message],
        tools: list[dict[str, Any]] | None,
        *,
        history: str,
        stop_ids: Sequence[int],
        group_id: int = 0,
        tool_parser: ToolParser | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.messages = [normalize(m) for m in messages]
        self.tools = tools
        self.history = history
        self.stop_ids = set(stop_ids)
        self.stop_texts = [t for t in tokenizer.convert_ids_to_tokens(sorted(self.stop_ids)) if t]
        self.group_id = group_id
        self.tool_parser = tool_parser or Hermes()
        self.calls: list[Interaction] = []
        self._parent: Interaction | None = None  # what the next call continues

    def next_input(self) -> list[int]:
        """The input ids of the next call."""
        last = self._parent = self.calls[-1] if self.calls else None
        if last is not None:
            answered = len(last.info["messages"]) + 1  # its messages and its reply
            new = self.messages[answered:]
            ids = continuation_ids(self.tokenizer, last, new, self.tools, self.stop_texts)
            if ids is not None:
                return ids
            if self.history == "keep_tokens":
                return appended_ids(self.tokenizer, last, new, self.tools, self.stop_texts)
            if self.history == "error":
                raise rewrite_error(last, "the chat template rewrote that call's turn")
        # the first call, or a rewritten history: the export starts a new row at this call
        text = render(self.tokenizer, self.messages, self.tools, generation=True)
        return encode(self.tokenizer, text)

    def record(self, input_ids: list[int], completion: Completion) -> tuple[Interaction, Reply]:
        """Record the call that generated ``completion`` from ``input_ids``; its reply
        joins the messages."""
        reply = assistant_reply(self.tokenizer, completion, self.stop_ids, self.tool_parser)
        call = Interaction(
            list(input_ids),
            list(completion.token_ids),
            list(completion.logprobs),
            completion.version,
            stop_reason=completion.finish_reason,
            parent=self._parent,
            group_id=self.group_id,
            info={"messages": list(self.messages), "reply": reply.message, "text": reply.text},
        )
        self.calls.append(call)
        self.messages.append(reply.message)
        return call, reply

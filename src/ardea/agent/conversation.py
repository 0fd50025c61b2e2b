"""Turning a chat request into token ids by appending to the parent call's tokens.

A request's ``messages`` continue an earlier call (its parent) when they start with the
parent's messages followed by the reply the parent returned. The child's input ids are then
the parent's input + output tokens (never re-tokenized), followed by the tokens of the text
the chat template adds after the reply: the end of the assistant turn the model did not
generate itself (e.g. the ``\\n`` after ``<|im_end|>``, or the whole end marker when the
reply stopped at the length limit or at a stop sequence), the new messages and the
generation prompt.

One rendering per turn. The template renders the child's whole conversation once,
``C = render(parent messages + reply + new messages, generation prompt)``, and each call
keeps its own rendering ``P`` (:attr:`~ardea.agent.interaction.Interaction.rendered`). The
template kept history when ``C`` starts with ``P`` followed by the reply's content and the
end of the assistant turn (a stop token's text); the new text is what follows. Only when
that comparison fails (a reply with tool calls, which templates format their own way, or a
template that changed something) is the exact, template-agnostic test made, with a second
rendering: ``A = render(parent messages + reply)``, history kept iff ``C`` starts with
``A``, new text ``C[len(A):]``. A template that rewrote history (e.g. it dropped a
``<think>`` block of the earlier reply) or an agent that changed the reply before sending it
back is a :class:`~ardea.agent.interaction.HistoryRewriteError` under ``history="error"``;
under ``new_trajectory`` the call is tokenized from ``C`` and the export starts a new
trajectory there.

``history="keep_tokens"`` keeps the tokens the engine saw and produced whatever the template
does with earlier turns: the child's input is the parent's input + output tokens followed by
only the text the template adds *after an assistant turn* for the new messages
(:meth:`ChatTemplate.keep`: one rendering with a placeholder assistant turn, the
placeholder's own rendering dropped). The engine then sees exactly what is trained and the
conversation stays one row; the trade-off is that at rollout the model sees its earlier
turns as it generated them, not as the template would re-render them (AReaL's and verl's
token-in-token-out agent loops do the same).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ardea.agent.interaction import Interaction, call_versions, rewrite_error
from ardea.agent.reply import Reply
from ardea.agent.stop_strings import cut_at
from ardea.agent.tool_parsers import Hermes, ToolParser
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


PLACEHOLDER = "ARDEA-KEPT-TURN-7f3a"  # stands for the parent's reply, whose tokens are kept


@dataclass(frozen=True)
class Prompt:
    """A call's input ids and the template's rendering they came from (None: not kept)."""

    input_ids: list[int]
    rendered: str | None


class ChatTemplate:
    """A tokenizer's chat template, rendering conversations and appending to a call's tokens
    (module docstring). ``renders`` counts the renderings (the cost per turn).

    Args:
        tokenizer: its chat template renders the messages.
        stop_ids: the engine's stop token ids (their text ends an assistant turn).
    """

    def __init__(self, tokenizer: Any, stop_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.stop_ids = set(stop_ids)
        self.stop_texts = [t for t in tokenizer.convert_ids_to_tokens(sorted(self.stop_ids)) if t]
        self.renders = 0

    def render(self, messages: Sequence[Message], tools, *, generation: bool) -> str:
        """The chat template's text of ``messages`` (with ``tools``)."""
        self.renders += 1
        return self.tokenizer.apply_chat_template(
            list(messages), tools=tools, tokenize=False, add_generation_prompt=generation
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def start(self, messages: Sequence[Message], tools) -> Prompt:
        """A new conversation: the rendering of ``messages`` with the generation prompt."""
        rendered = self.render(messages, tools, generation=True)
        return Prompt(self.encode(rendered), rendered)

    def extend(self, parent: Interaction, new: Sequence[Message], tools, history: str) -> Prompt:
        """The child of ``parent`` whose messages add ``new`` after its reply (module
        docstring), under the ``history`` policy."""
        if history == "keep_tokens":
            return self.keep(parent, new, tools)
        rendered = self.render([*parent.messages, parent.reply.message, *new], tools,
                               generation=True)  # fmt: skip
        glue = self._glue(parent, rendered, tools)
        if glue is not None:
            return Prompt(parent.tokens + self.encode(glue), rendered)
        if history == "error":
            raise rewrite_error(parent, "the chat template rewrote that call's turn")
        return Prompt(self.encode(rendered), rendered)  # new_trajectory: a new row starts here

    def keep(self, parent: Interaction, new: Sequence[Message], tools) -> Prompt:
        """``keep_tokens``: the parent's input + output tokens followed by the text the
        template adds after an assistant turn for ``new`` (module docstring): the end of
        the turn (minus the stop token when the model generated it), the new messages and
        the generation prompt."""
        placeholder = {"role": "assistant", "content": PLACEHOLDER}
        rendered = self.render([*parent.messages, placeholder, *new], tools, generation=True)
        after = rendered[rendered.rindex(PLACEHOLDER) + len(PLACEHOLDER) :]
        found = [(after.find(t), t) for t in self.stop_texts if after.find(t) >= 0]
        if not found:  # the template closes the turn with a marker the model does not stop at
            end = self._own_turn_end(parent, tools)
            if self._stopped(parent) and after.startswith(end):
                after = after[len(end) :]
            return Prompt(parent.tokens + self.encode(after), None)
        at, marker = min(found)
        glue = after[at + len(marker) :] if self._generated(parent, marker) else after[at:]
        return Prompt(parent.tokens + self.encode(glue), None)

    def _glue(self, parent: Interaction, rendered: str, tools) -> str | None:
        """The text ``rendered`` (the child's conversation) adds after the parent's last
        generated token, or None when the template rewrote history."""
        before, content = parent.rendered, parent.reply.content
        if (
            before is not None
            and not parent.reply.calls
            and rendered.startswith(before)
            and rendered.startswith(content, len(before))
        ):
            after = rendered[len(before) + len(content) :]
            marker = next((t for t in self.stop_texts if after.startswith(t)), None)
            if marker is not None:  # the one rendering agrees: no second one needed
                return after[len(marker) :] if self._generated(parent, marker) else after
        answered = self.render([*parent.messages, parent.reply.message], tools, generation=False)
        if not rendered.startswith(answered):
            return None
        return self._turn_end(answered, parent, tools) + rendered[len(answered) :]

    def _turn_end(self, answered: str, parent: Interaction, tools) -> str:
        """The text after the reply's last generated token up to the end of ``answered``:
        the template's turn end, minus the stop token when the model generated that one."""
        at, marker = max(((answered.rfind(t), t) for t in self.stop_texts), default=(-1, ""))
        if at < 0:  # the template closes the turn with a marker the model does not stop at
            return "" if self._stopped(parent) else self._own_turn_end(parent, tools)
        return answered[at + len(marker) :] if self._generated(parent, marker) else answered[at:]

    def _own_turn_end(self, parent: Interaction, tools) -> str:
        """The text the template closes an assistant turn with (after its content), where
        that is no stop token of the model's: gpt-oss's ``<|end|>``, which its model never
        generates (it stops a final answer at ``<|return|>``, a tool call at ``<|call|>``).
        A turn the model stopped already has its end, the stop token, so the row does not
        hold both; a turn cut at the length limit is closed with this text."""
        placeholder = {"role": "assistant", "content": PLACEHOLDER}
        closed = self.render([*parent.messages, placeholder], tools, generation=False)
        return closed[closed.rindex(PLACEHOLDER) + len(PLACEHOLDER) :]

    def _generated(self, parent: Interaction, marker: str) -> bool:
        """Whether the parent's last generated token is the stop token ``marker``."""
        last = parent.output_ids[-1:]
        tokens = self.tokenizer.convert_ids_to_tokens(last) if last else []
        return parent.stop_reason == "stop" and tokens == [marker]

    def _stopped(self, parent: Interaction) -> bool:
        """Whether the parent's reply ended at one of the model's stop tokens."""
        last = parent.output_ids[-1:]
        return parent.stop_reason == "stop" and bool(last) and last[0] in self.stop_ids


def reply_to(template: ChatTemplate, completion: Completion, parser: ToolParser | None) -> Reply:
    """The reply of ``completion`` (a stop token it ended with is not part of the text),
    its tool calls found by ``parser`` (None: none looked for)."""
    return Reply.parse(generated_text(template.tokenizer, completion, template.stop_ids), parser)


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
        template: renders the messages (:class:`ChatTemplate`).
        messages: the first messages; ``tools``: the tools' schemas (or None).
        history: ``error`` (a template that rewrote history raises
            :class:`~ardea.agent.interaction.HistoryRewriteError`), ``new_trajectory``
            (that call is tokenized from scratch; the export starts a new row there) or
            ``keep_tokens`` (the earlier tokens are kept: :meth:`ChatTemplate.keep`).
        group_id: the row it answers.
        tool_parser: finds the tool calls of each reply (default ``hermes``).
    """

    def __init__(
        self,
        template: ChatTemplate,
        messages: Sequence[Message],
        tools: list[dict[str, Any]] | None,
        *,
        history: str,
        group_id: int = 0,
        tool_parser: ToolParser | None = None,
    ) -> None:
        self.template = template
        self.messages = [normalize(m) for m in messages]
        self.tools = tools
        self.history = history
        self.group_id = group_id
        self.tool_parser = tool_parser or Hermes()
        self.calls: list[Interaction] = []
        self._parent: Interaction | None = None  # what the next call continues
        self._rendered: str | None = None  # the next call's rendering

    def next_input(self) -> list[int]:
        """The input ids of the next call."""
        last = self._parent = self.calls[-1] if self.calls else None
        if last is None:
            prompt = self.template.start(self.messages, self.tools)
        else:
            new = self.messages[len(last.messages) + 1 :]  # after its messages and its reply
            prompt = self.template.extend(last, new, self.tools, self.history)
        self._rendered = prompt.rendered
        return prompt.input_ids

    def record(self, input_ids: list[int], completion: Completion) -> Interaction:
        """Record the call that generated ``completion`` from ``input_ids``; its reply
        (:attr:`Interaction.reply`) joins the messages."""
        reply = reply_to(self.template, completion, self.tool_parser)
        call = Interaction(
            list(input_ids),
            list(completion.token_ids),
            list(completion.logprobs),
            call_versions(completion, len(completion.token_ids)),
            stop_reason=completion.finish_reason,
            parent=self._parent,
            group_id=self.group_id,
            messages=list(self.messages),
            reply=reply,
            rendered=self._rendered,
        )
        self.calls.append(call)
        self.messages.append(reply.message)
        return call

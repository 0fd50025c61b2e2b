"""Which recorded call a chat request continues, and the request's input ids.

A request continues a call (its parent) when its messages start with that call's messages
and then:

1. the reply the call returned (exact, after normalisation): the usual case;
2. no assistant message at all, when the call's reply was empty (``content: ""`` and no tool
   calls: clients such as the OpenAI Agents SDK drop an empty reply from their history);
3. under ``keep_tokens``, *another* assistant message: agent code that rewrites its own
   turns (smolagents sends its tool calls back as text and tool results as user
   ``Observation:`` messages). The rewritten turn must be one the model generated in this
   conversation: the request carries that call's tool-call ids or its reply's text, or
   names it with ``metadata.parent_id``. Without such evidence the assistant message is the
   agent's own (a few-shot example that happens to follow a prompt asked before) and the
   request starts a new conversation. A request that does continue with a rewritten turn
   is marked (``rewritten``: counted by the client, ``rewritten_turns`` of its exported
   row); among several calls with the same messages (the G conversations of a group) that
   the evidence cannot tell apart, ``metadata.parent_id`` must name one.

The input ids then extend the parent's tokens (:mod:`ardea.agent.conversation`). Calls are
indexed by a running hash of their messages, so finding the parent of a conversation of
``n`` messages costs ``O(n)`` hashes. A call whose reply was never delivered (an orphan) is
never a parent.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ardea.agent.conversation import ChatTemplate, Prompt
from ardea.agent.interaction import Interaction, rewrite_error
from ardea.agent.request_checks import RequestError

Message = dict[str, Any]


def prefix_keys(messages: Sequence[Message]) -> list[str]:
    """``keys[k]``: a hash of ``messages[:k]`` (``k`` = 0 .. len)."""
    keys = [""]
    for m in messages:
        text = json.dumps(m, sort_keys=True, ensure_ascii=False)
        keys.append(hashlib.sha1((keys[-1] + text).encode()).hexdigest())
    return keys


def empty_reply(call: Interaction) -> bool:
    return not call.reply.content and not call.reply.calls


@dataclass(frozen=True)
class Placed:
    """Where a request goes: its ``prompt``, the ``parent`` it continues (None: a new
    conversation) and whether it replaced that call's reply (``rewritten``)."""

    prompt: Prompt
    parent: Interaction | None
    rewritten: bool = False


class Lineage:
    """The recorded calls indexed by their messages (module docstring).

    Args:
        template: renders continuations (:class:`~ardea.agent.conversation.ChatTemplate`).
        history: ``error``, ``new_trajectory`` or ``keep_tokens``.
    """

    def __init__(self, template: ChatTemplate, history: str) -> None:
        self.template = template
        self.history = history
        self._prompts: dict[str, list[Interaction]] = {}  # hash(messages) → calls
        self._replies: dict[str, list[Interaction]] = {}  # hash(messages + reply) → calls
        self._lock = threading.Lock()

    def add(self, call: Interaction) -> None:
        """Index ``call`` by its messages and by its messages and reply."""
        keys = prefix_keys([*call.messages, call.reply.message])
        with self._lock:
            self._prompts.setdefault(keys[-2], []).append(call)
            self._replies.setdefault(keys[-1], []).append(call)

    def place(self, messages: list[Message], tools, named: Interaction | None = None) -> Placed:
        """The request's prompt and the call it continues (module docstring)."""
        if named is not None:
            return self._named(named, messages, tools)
        keys = prefix_keys(messages)
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        if last >= 0:
            parent = self._take(self._replies.get(keys[last + 1], []))
            if parent is not None:
                return Placed(self._continue(parent, messages[last + 1 :], tools), parent)
        for k in range(len(messages) - 1, last, -1):  # 2. an empty reply left out
            calls = [c for c in self._prompts.get(keys[k], []) if empty_reply(c)]
            parent = self._take(calls)
            if parent is not None:
                return Placed(self._continue(parent, messages[k:], tools), parent)
        asked = self._prompts.get(keys[last], []) if last >= 0 else []
        if asked and self.history == "keep_tokens":  # 3. the agent rewrote its turn
            parent = self._take(self._meant(asked, messages[last:], last))
            if parent is not None:
                prompt = self.template.keep(parent, messages[last + 1 :], tools)
                return Placed(prompt, parent, rewritten=True)
        elif asked and self.history == "error":
            raise rewrite_error(
                asked[0], f"its assistant message {last} differs from that call's reply"
            )
        return Placed(self.template.start(messages, tools), None)

    def _named(self, parent: Interaction, messages, tools) -> Placed:
        """``metadata.parent_id`` named the call: the messages must continue it."""
        before = parent.messages
        rest = messages[len(before) :]
        if messages[: len(before)] != before:
            raise rewrite_error(parent, "its messages do not start with that call's messages")
        if rest and rest[0] == parent.reply.message:
            return Placed(self._continue(parent, rest[1:], tools), parent)
        if empty_reply(parent) and not (rest and rest[0]["role"] == "assistant"):
            return Placed(self._continue(parent, rest, tools), parent)
        if rest and rest[0]["role"] == "assistant" and self.history == "keep_tokens":
            return Placed(self.template.keep(parent, rest[1:], tools), parent, rewritten=True)
        raise rewrite_error(parent, "its messages do not continue with that call's reply")

    def _continue(self, parent: Interaction, new: list[Message], tools) -> Prompt:
        return self.template.extend(parent, new, tools, self.history)

    def _meant(self, calls: list[Interaction], rest: list[Message], at: int) -> list[Interaction]:
        """The calls among ``calls`` (same messages) that the rewritten turn ``rest[0]`` and
        what follows it point to: by tool-call ids, then by reply text; none when nothing
        the request carries comes from any of them."""
        live = [c for c in calls if not c.orphan]
        carried = json.dumps(rest, ensure_ascii=False)
        by_id = [c for c in live if any(i in carried for i in c.reply.call_ids)]
        if by_id:
            return by_id
        said = rest[0].get("content") or ""
        chosen = [c for c in live if c.reply.content and c.reply.content in said]
        if len({tuple(c.output_ids) for c in chosen}) > 1:
            raise RequestError(
                f"messages[{at}]: the assistant message differs from the replies of the "
                f"{len(chosen)} calls made with these messages and names none of them; pass "
                'metadata={"parent_id": <the completion id>} to say which call it continues',
                param=f"messages[{at}]",
            )
        return chosen

    def _take(self, calls: list[Interaction]) -> Interaction | None:
        """The first call not yet continued (else the latest), marked continued."""
        with self._lock:
            live = [c for c in calls if not c.orphan]
            fresh = [c for c in live if not c.continued]
            parent = (fresh or live[-1:] or [None])[0]
            if parent is not None:
                parent.continued = True
            return parent

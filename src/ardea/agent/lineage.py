"""Which recorded call a chat request continues, and the request's input ids.

A request continues a call (its parent) when its messages start with that call's messages
and then:

1. the reply the call returned (exact, after normalisation): the usual case;
2. no assistant message at all, when the call's reply was empty (``content: ""`` and no tool
   calls: clients such as the OpenAI Agents SDK drop an empty reply from their history);
3. under ``keep_tokens``, *another* assistant message: agent code that rewrites its own
   turns (smolagents sends its tool calls back as text and tool results as user
   ``Observation:`` messages). Among calls made with the same messages (the G conversations
   of a group) the one meant is the one whose tool-call ids or reply text the request
   carries; when none can be told apart the request names it with ``metadata.parent_id``.

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
from typing import Any

from ardea.agent.conversation import appended_ids, continuation_ids, encode, render
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
    reply = call.info["reply"]
    return not reply.get("content") and not reply.get("tool_calls")


class Lineage:
    """The recorded calls indexed by their messages (module docstring).

    Args:
        tokenizer: its chat template renders continuations.
        history: ``error``, ``new_trajectory`` or ``keep_tokens``.
        stop_texts: the engine's stop tokens as text (the end of an assistant turn).
    """

    def __init__(self, tokenizer: Any, history: str, stop_texts: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.history = history
        self.stop_texts = list(stop_texts)
        self._prompts: dict[str, list[Interaction]] = {}  # hash(messages) → calls
        self._replies: dict[str, list[Interaction]] = {}  # hash(messages + reply) → calls
        self._lock = threading.Lock()

    def add(self, call: Interaction) -> None:
        """Index ``call`` (its ``info`` holds ``messages`` and ``reply``)."""
        keys = prefix_keys([*call.info["messages"], call.info["reply"]])
        with self._lock:
            self._prompts.setdefault(keys[-2], []).append(call)
            self._replies.setdefault(keys[-1], []).append(call)

    def input_ids(
        self, messages: list[Message], tools, named: Interaction | None = None
    ) -> tuple[list[int], Interaction | None]:
        """The request's input ids and the call it continues (None: a new conversation)."""
        if named is not None:
            return self._named(named, messages, tools)
        keys = prefix_keys(messages)
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        if last >= 0:
            parent = self._take(self._replies.get(keys[last + 1], []))
            if parent is not None:
                return self._continue(parent, messages[last + 1 :], tools), parent
        for k in range(len(messages) - 1, last, -1):  # 2. an empty reply left out
            calls = [c for c in self._prompts.get(keys[k], []) if empty_reply(c)]
            parent = self._take(calls)
            if parent is not None:
                return self._continue(parent, messages[k:], tools), parent
        asked = self._prompts.get(keys[last], []) if last >= 0 else []
        if asked and self.history == "keep_tokens":  # 3. the agent rewrote its turn
            parent = self._take(self._meant(asked, messages[last:], last))
            ids = appended_ids(self.tokenizer, parent, messages[last + 1 :], tools, self.stop_texts)
            return ids, parent
        if asked and self.history == "error":
            raise rewrite_error(
                asked[0], f"its assistant message {last} differs from that call's reply"
            )
        return self._scratch(messages, tools), None

    def _named(self, parent: Interaction, messages, tools):
        """``metadata.parent_id`` named the call: the messages must continue it."""
        before = parent.info["messages"]
        rest = messages[len(before) :]
        if messages[: len(before)] != before:
            raise rewrite_error(parent, "its messages do not start with that call's messages")
        if rest and rest[0] == parent.info["reply"]:
            return self._continue(parent, rest[1:], tools), parent
        if empty_reply(parent) and not (rest and rest[0]["role"] == "assistant"):
            return self._continue(parent, rest, tools), parent
        if rest and rest[0]["role"] == "assistant" and self.history == "keep_tokens":
            return appended_ids(self.tokenizer, parent, rest[1:], tools, self.stop_texts), parent
        raise rewrite_error(parent, "its messages do not continue with that call's reply")

    def _continue(self, parent: Interaction, new: list[Message], tools) -> list[int]:
        ids = continuation_ids(self.tokenizer, parent, new, tools, self.stop_texts)
        if ids is not None:
            return ids
        if self.history == "keep_tokens":
            return appended_ids(self.tokenizer, parent, new, tools, self.stop_texts)
        if self.history == "error":
            raise rewrite_error(parent, "the chat template rewrote that call's turn")
        return self._scratch([*parent.info["messages"], parent.info["reply"], *new], tools)

    def _scratch(self, messages: list[Message], tools) -> list[int]:
        return encode(self.tokenizer, render(self.tokenizer, messages, tools, generation=True))

    def _meant(self, calls: list[Interaction], rest: list[Message], at: int) -> list[Interaction]:
        """The calls among ``calls`` (same messages) that the rewritten turn ``rest[0]`` and
        what follows it point to: by tool-call ids, then by reply text."""
        live = [c for c in calls if not c.info.get("orphan")]
        carried = json.dumps(rest, ensure_ascii=False)
        by_id = [c for c in live if any(i in carried for i in c.info.get("call_ids", []))]
        if by_id:
            return by_id
        said = rest[0].get("content") or ""
        by_text = [
            c for c in live if c.info["reply"]["content"] and c.info["reply"]["content"] in said
        ]
        chosen = by_text or live
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
            live = [c for c in calls if not c.info.get("orphan")]
            fresh = [c for c in live if not c.info["continued"]]
            parent = (fresh or live[-1:] or [None])[0]
            if parent is not None:
                parent.info["continued"] = True
            return parent

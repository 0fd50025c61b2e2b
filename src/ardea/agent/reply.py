"""The model's reply to one call, parsed once.

A :class:`Reply` is the generated text (it *is* a ``str``: environments written against
text, ``first_int(action)`` and the like, keep working) together with what the configured
tool parser (:mod:`ardea.agent.tool_parsers`) found in it: every tool call in order
(a malformed one with ``error`` set, so the model can be told), the content without the
well-formed calls, and the ids the chat API gave those calls. The client, the episode
runner and the environments all read this one parse; nothing parses a reply's text again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ardea.agent.tool_parsers import ToolParser
from ardea.agent.tools import ToolCall

Message = dict[str, Any]


class Reply(str):
    """A reply's text with its parsed tool calls (module docstring): ``Reply(text,
    tool_calls, content, call_ids)`` with ``text`` the decoded reply (up to its stop token or
    stop sequence), ``tool_calls`` every call the parser found in order (malformed ones have
    ``error``), ``content`` the text without the well-formed calls (default ``text``) and
    ``call_ids`` the chat API's ids of the well-formed calls (none for the episode runner).
    """

    tool_calls: tuple[ToolCall, ...]
    content: str
    call_ids: tuple[str, ...]

    def __new__(
        cls,
        text: str,
        tool_calls: Sequence[ToolCall] = (),
        content: str | None = None,
        call_ids: Sequence[str] = (),
    ) -> Reply:
        reply = super().__new__(cls, text)
        reply.tool_calls = tuple(tool_calls)
        reply.content = text if content is None or not reply.calls else content
        reply.call_ids = tuple(call_ids)
        return reply

    @classmethod
    def parse(cls, text: str, parser: ToolParser | None, call_ids: Sequence[str] = ()) -> Reply:
        """The reply whose text is ``text``, its calls found by ``parser`` (None: no calls
        are looked for, e.g. ``tool_choice="none"``)."""
        if parser is None:
            return cls(text)
        found, content = parser.parse(text)
        return cls(text, found, content, call_ids)

    @property
    def text(self) -> str:
        return str(self)

    @property
    def calls(self) -> list[ToolCall]:
        """The well-formed tool calls."""
        return [c for c in self.tool_calls if c.error is None]

    @property
    def message(self) -> Message:
        """The assistant message (normalised: role, content, tool calls as ``{"name",
        "arguments"}``) that a conversation continues with."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.calls:
            message["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in self.calls]
        return message

    def with_call_ids(self, call_ids: Sequence[str]) -> Reply:
        return Reply(self.text, self.tool_calls, self.content, call_ids)

    def state(self) -> dict[str, Any]:
        """As plain lists and dicts (checkpoints load with ``weights_only``)."""
        calls = [[c.name, c.arguments, c.error] for c in self.tool_calls]
        return {"text": self.text, "tool_calls": calls, "content": self.content,
                "call_ids": list(self.call_ids)}  # fmt: skip

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Reply:
        calls = [ToolCall(name, args, error) for name, args, error in state["tool_calls"]]
        return cls(state["text"], calls, state["content"], state["call_ids"])

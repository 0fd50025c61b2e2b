"""A generated completion as the assistant reply a chat request asked for, and the
``ChatCompletion`` returned for it.

The request's options shape the reply without ever changing a sampled token: ``stop``
sequences cut the text and the recorded tokens at the first match; ``tool_choice="none"``
leaves tool-call blocks as text; ``parallel_tool_calls=False`` ends the reply after its first
tool call (tokens cut there too, for formats whose calls have an end marker: ``hermes``,
``deepseek_v3``); ``required`` or a named function cannot be enforced on
tokens already sampled, so a reply without that call is returned as it is and marked
``unmet`` (counted by the client).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_message_tool_call import (
    ChatCompletionMessageToolCall,
    Function,
)
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

from ardea.agent.conversation import ChatTemplate, generated_text, stop_at
from ardea.agent.reply import Reply
from ardea.agent.tool_parsers import ToolParser
from ardea.rollout.engine import Completion


@dataclass(frozen=True)
class RecordedReply:
    """One choice: the ``completion`` as recorded (cut where the request said), its
    ``reply`` (parsed once; tool calls with the ids the API gives them), the OpenAI
    ``chat_message``, whether a required tool call is missing (``unmet``) and the finish
    reason."""

    completion: Completion
    reply: Reply
    chat_message: ChatCompletionMessage
    unmet: bool
    finish_reason: str


def recorded_reply(
    template: ChatTemplate, completion: Completion, request, parser: ToolParser
) -> RecordedReply:
    """The reply ``request`` (a ``ChatRequest``) gets for ``completion``, its tool calls
    found by ``parser`` (module docstring)."""
    tokenizer, stop_ids = template.tokenizer, template.stop_ids
    c, text = completion, None
    if request.stop:
        cut = stop_at(tokenizer, c, stop_ids, request.stop, keep=False)
        if cut is not None:
            c, text = cut
    if text is None:
        text = generated_text(tokenizer, c, stop_ids)
    parser = parser if request.tool_choice != "none" else None
    reply = Reply.parse(text, parser)
    if parser and parser.end and not request.parallel_tool_calls and len(reply.calls) > 1:
        c, text = stop_at(tokenizer, c, stop_ids, [parser.end], keep=True)
        reply = Reply.parse(text, parser)
    names = [call.name for call in reply.calls]
    unmet = (request.tool_choice == "required" and not names) or (
        request.tool_choice not in ("auto", "none", "required") and request.tool_choice not in names
    )
    tool_calls = [
        ChatCompletionMessageToolCall(
            id=f"call_{uuid.uuid4().hex[:12]}",
            type="function",
            function=Function(
                name=call.name, arguments=json.dumps(call.arguments, ensure_ascii=False)
            ),
        )
        for call in reply.calls
    ]
    message = ChatCompletionMessage(
        role="assistant", content=reply.content, tool_calls=tool_calls or None
    )
    return RecordedReply(
        c, reply.with_call_ids([t.id for t in tool_calls]), message, bool(unmet),
        "tool_calls" if tool_calls else c.finish_reason,
    )  # fmt: skip


def chat_completion(
    completion_id: str, request, replies: list[RecordedReply], tokenizer: Any
) -> ChatCompletion:
    """The ``ChatCompletion`` of ``replies`` (one choice each)."""
    generated = sum(len(r.completion.token_ids) for r in replies)
    return ChatCompletion(
        id=completion_id,
        object="chat.completion",
        created=int(time.time()),
        model=request.model,
        choices=[
            Choice(
                index=k,
                finish_reason=r.finish_reason,
                message=r.chat_message,
                logprobs=_logprobs(tokenizer, r.completion) if request.logprobs else None,
            )
            for k, r in enumerate(replies)
        ],
        usage=CompletionUsage(
            prompt_tokens=len(request.input_ids),
            completion_tokens=generated,
            total_tokens=len(request.input_ids) + generated,
        ),
    )


def _logprobs(tokenizer: Any, c: Completion) -> ChoiceLogprobs:
    tokens = tokenizer.convert_ids_to_tokens(c.token_ids)
    return ChoiceLogprobs(
        content=[
            ChatCompletionTokenLogprob(token=t, logprob=lp, bytes=None, top_logprobs=[])
            for t, lp in zip(tokens, c.logprobs)
        ]
    )

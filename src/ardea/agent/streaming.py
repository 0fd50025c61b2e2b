"""``stream=True`` for the recording client: a finished completion as the chunks an
OpenAI-compatible server streams.

The engine generates a batch of replies together, so a reply is complete before its first
chunk goes out: streaming here is the protocol (what agent frameworks that always stream
expect), not token-by-token latency. A completion becomes chunks with its id: each
choice's ``delta`` (role, content, tool calls, log-probs when asked; ``index`` names the
choice, so ``n`` > 1 streams as OpenAI streams it), then each choice's ``finish_reason``,
then — with ``stream_options={"include_usage": True}`` — a chunk with no
choices and the token ``usage``. Over HTTP each chunk is one server-sent event
``data: {json}``, and ``data: [DONE]`` ends the stream.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import (
    Choice,
    ChoiceDelta,
    ChoiceDeltaToolCall,
    ChoiceDeltaToolCallFunction,
    ChoiceLogprobs,
)

from ardea.agent.request_checks import RequestError, shown

STREAM_OPTIONS = ("include_usage",)


def check_stream_options(stream_options: Any) -> bool:
    """Whether ``stream_options`` asks for a usage chunk; a ValueError naming anything else."""
    if stream_options is None:
        return False
    if not isinstance(stream_options, dict):
        raise RequestError(
            f"stream_options must be an object, got {shown(stream_options)}", param="stream_options"
        )
    unknown = sorted(set(stream_options) - set(STREAM_OPTIONS))
    if unknown:
        raise RequestError(
            f"stream_options has unsupported key(s) {unknown}; supported: include_usage",
            param="stream_options",
        )
    return bool(stream_options.get("include_usage"))


def completion_chunks(
    completion: ChatCompletion, *, include_usage: bool
) -> list[ChatCompletionChunk]:
    """The chunks streaming ``completion`` sends (module docstring): per choice ``k`` its
    delta, then per choice its finish reason, each chunk naming its choice by ``index``."""
    deltas, finishes = [], []
    for choice in completion.choices:
        message = choice.message
        tool_calls = [
            ChoiceDeltaToolCall(
                index=i,
                id=call.id,
                type="function",
                function=ChoiceDeltaToolCallFunction(
                    name=call.function.name, arguments=call.function.arguments
                ),
            )
            for i, call in enumerate(message.tool_calls or [])
        ]
        delta = ChoiceDelta(
            role="assistant", content=message.content, tool_calls=tool_calls or None
        )
        logprobs = ChoiceLogprobs(content=choice.logprobs.content) if choice.logprobs else None
        k = choice.index
        deltas.append([Choice(index=k, delta=delta, logprobs=logprobs, finish_reason=None)])
        finishes.append([Choice(index=k, delta=ChoiceDelta(), finish_reason=choice.finish_reason)])
    choices = [*deltas, *finishes]
    if include_usage:
        choices.append([])

    def chunk(of: list[Choice], last: bool) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=completion.id,
            object="chat.completion.chunk",
            created=completion.created,
            model=completion.model,
            choices=of,
            usage=completion.usage if last and include_usage else None,
        )

    return [chunk(of, i == len(choices) - 1) for i, of in enumerate(choices)]


class ChunkStream:
    """What ``create(stream=True)`` returns in process: an iterator of
    ``ChatCompletionChunk`` that is also a context manager, like the ``openai`` package's
    ``Stream``."""

    def __init__(self, chunks: list[ChatCompletionChunk]) -> None:
        self._chunks = iter(chunks)

    def __iter__(self) -> Iterator[ChatCompletionChunk]:
        return self

    def __next__(self) -> ChatCompletionChunk:
        return next(self._chunks)

    def close(self) -> None:
        self._chunks = iter(())

    def __enter__(self) -> ChunkStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def server_sent_events(chunks: Iterable[ChatCompletionChunk]) -> Iterator[str]:
    """Each chunk as a server-sent event, then the ``[DONE]`` event."""
    for c in chunks:
        yield f"data: {c.model_dump_json(exclude_none=True)}\n\n"
    yield "data: [DONE]\n\n"

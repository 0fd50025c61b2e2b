"""An OpenAI-compatible chat-completions client over an ardea generation engine, recording
every call as an :class:`~ardea.agent.interaction.Interaction`.

``client.chat.completions.create(messages=..., tools=..., temperature=..., max_tokens=...)``
has the ``openai`` package's signature (the options below) and returns its own
``ChatCompletion``, so agent code written for the OpenAI API runs unchanged, in process or
over HTTP (:mod:`ardea.agent.server`). What it serves:

- the prompt: a request that continues an earlier call is appended to that call's tokens
  (:mod:`ardea.agent.conversation`); any other request is the chat template's rendering.
  The call continued is the one whose messages and reply the request's messages start
  with (among several such calls, e.g. conversations with the same history so far, the
  oldest not yet continued), or the one named by ``metadata={"parent_id": <completion
  id>}``, which keeps conversations with equal histories apart (their rewards too);
- the reply: the generated text with each well-formed ``<tool_call>`` block moved into
  ``message.tool_calls`` (finish reason ``tool_calls``), behaviour log-probs in
  ``choices[0].logprobs`` when ``logprobs=True``;
- ``stream=True`` (with ``stream_options={"include_usage": True}``): the same reply as
  ``ChatCompletionChunk``s (:mod:`ardea.agent.streaming`), for agent code that always
  streams; ``user`` is recorded in the call's ``info``;
- the record: input ids, output ids, log-probs, the engine's policy version per token,
  stop reason; :meth:`RecordingClient.set_reward` attaches a reward by completion id and
  :meth:`RecordingClient.export` returns the trajectories.

Any other option (``stop``, penalties, ``logit_bias``, ``n`` > 1, ...) is an error naming
it: the reply would not be what the request asked for.

Batching. Calls made concurrently (threads, the HTTP server's worker threads) are generated
together: a call waits ``batch_window`` seconds for others, then every waiting call with the
same sampling options goes to the engine in one ``generate``; calls arriving meanwhile form
the next batch. :meth:`RecordingClient.create_many` serves a list of requests as one batch
directly (the episode runner does).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_message_tool_call import (
    ChatCompletionMessageToolCall,
    Function,
)
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

from ardea.agent.conversation import (
    assistant_reply,
    continuation_ids,
    encode,
    message_key,
    normalize,
    render,
)
from ardea.agent.interaction import (
    HISTORY_POLICIES,
    Interaction,
    export_trajectories,
    rewrite_error,
)
from ardea.agent.streaming import ChunkStream, check_stream_options, completion_chunks
from ardea.rollout.engine import Completion, GenerationEngine, SamplingParams

_OPTIONS = ("model", "tools", "temperature", "top_p", "max_tokens", "max_completion_tokens",
            "seed", "logprobs", "n", "stream", "stream_options", "tool_choice", "metadata",
            "user")  # fmt: skip
PARENT_KEY = "parent_id"  # metadata={"parent_id": <completion id>}: the call this one continues


class ContextLengthError(ValueError):
    """A request's prompt plus ``max_tokens`` does not fit the model's context."""


@dataclasses.dataclass
class ChatRequest:
    """One chat-completions request after checking (module docstring)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    params: SamplingParams
    logprobs: bool = False
    model: str = "ardea"
    stream: bool = False
    include_usage: bool = False  # stream_options={"include_usage": True}
    user: str | None = None
    input_ids: list[int] = dataclasses.field(default_factory=list)
    parent: Interaction | None = None
    result: ChatCompletion | BaseException | None = None
    row_id: int | None = None  # its row of the engine call's random numbers (None: any)


class RecordingClient:
    """The recording chat-completions client (module docstring).

    Args:
        engine: generates the replies (its version labels each token).
        tokenizer: its chat template renders requests.
        max_tokens: default ``max_tokens`` of a request.
        temperature: default temperature.
        history: ``error`` or ``new_trajectory`` (what a rewritten history does).
        batch_window: seconds a concurrent call waits for others to join its batch.
    """

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Any,
        *,
        max_tokens: int = 64,
        temperature: float = 1.0,
        history: str = "error",
        batch_window: float = 0.005,
    ) -> None:
        if history not in HISTORY_POLICIES:
            raise ValueError(f"history={history!r}; choose one of {', '.join(HISTORY_POLICIES)}")
        self.engine = engine
        self.tokenizer = tokenizer
        self.defaults = SamplingParams(temperature=temperature, max_new_tokens=max_tokens)
        self.history = history
        self.batch_window = batch_window
        self.max_positions = engine.max_context
        self.stop_ids = set(engine.stop_token_ids)
        self.stop_texts = [t for t in tokenizer.convert_ids_to_tokens(sorted(self.stop_ids)) if t]
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))
        self.interactions: list[Interaction] = []
        self._by_id: dict[str, Interaction] = {}
        self._replies: dict[str, list[Interaction]] = {}  # key(messages + reply) → calls
        self._prompts: dict[str, Interaction] = {}  # key(messages) → a call they were sent in
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._waiting: list[ChatRequest] = []
        self._busy = False
        self.engine_calls = 0

    # ------------------------------------------------------------------ the API
    def create(self, **options: Any) -> ChatCompletion | ChunkStream:
        """``chat.completions.create``: serve one request (batched with concurrent ones);
        with ``stream=True`` the completion comes as chunks (:mod:`ardea.agent.streaming`)."""
        request = self.request(**options)
        with self._cond:
            self._waiting.append(request)
            while request.result is None:
                if self._busy:
                    self._cond.wait()
                    continue
                self._busy = True
                self._cond.release()
                try:
                    time.sleep(self.batch_window)  # let concurrent calls join this batch
                    with self._cond:
                        batch, self._waiting = self._waiting, []
                    self._serve(batch)
                finally:
                    self._cond.acquire()
                    self._busy = False
                    self._cond.notify_all()
        if isinstance(request.result, BaseException):
            raise request.result
        if request.stream:
            chunks = completion_chunks(request.result, include_usage=request.include_usage)
            return ChunkStream(chunks)
        return request.result

    def create_many(self, requests: Sequence[ChatRequest]) -> list[ChatCompletion | BaseException]:
        """Serve ``requests`` (from :meth:`request`) as one batch: each one's completion, or
        the exception that request failed with (e.g. :class:`ContextLengthError`)."""
        self._serve(list(requests))
        return [r.result for r in requests]

    def request(self, *, messages: Sequence[Any], **options: Any) -> ChatRequest:
        """Check a request's options (an unsupported one is a TypeError naming it)."""
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise TypeError(
                f"chat.completions.create() got unsupported option(s) {unknown}; "
                f"supported: messages, {', '.join(_OPTIONS)}"
            )
        stream = bool(options.get("stream"))
        include_usage = check_stream_options(options.get("stream_options"))
        if options.get("stream_options") is not None and not stream:
            raise ValueError("stream_options is only allowed with stream=True")
        if options.get("n", 1) != 1:
            raise ValueError(f"n={options['n']!r}: one choice per call (make G calls instead)")
        if not messages:
            raise ValueError("messages is empty")
        max_tokens = options.get("max_completion_tokens") or options.get("max_tokens")
        params = dataclasses.replace(
            self.defaults,
            temperature=_given(options.get("temperature"), self.defaults.temperature),
            top_p=_given(options.get("top_p"), 1.0),
            max_new_tokens=max_tokens or self.defaults.max_new_tokens,
            seed=options.get("seed"),
        )
        parent_id = (options.get("metadata") or {}).get(PARENT_KEY)
        return ChatRequest(
            [normalize(m) for m in messages],
            options.get("tools") or None,
            params,
            logprobs=bool(options.get("logprobs")),
            model=str(options.get("model") or "ardea"),
            stream=stream,
            include_usage=include_usage,
            user=options.get("user"),
            parent=self.get(parent_id) if parent_id is not None else None,
        )

    def set_reward(self, completion_id: str, reward: float) -> None:
        """Attach ``reward`` to the call that returned ``completion_id``."""
        self.get(completion_id).reward = float(reward)

    def get(self, completion_id: str) -> Interaction:
        if completion_id not in self._by_id:
            raise KeyError(f"no recorded completion {completion_id!r}")
        return self._by_id[completion_id]

    def export(self, *, style: str = "conversation"):
        """The recorded calls as trajectories (:func:`~ardea.agent.export_trajectories`)."""
        with self._lock:
            calls = list(self.interactions)
        return export_trajectories(calls, style=style, history=self.history)

    # ------------------------------------------------------------------ serving
    def _serve(self, batch: list[ChatRequest]) -> None:
        """Prepare each request's tokens, then one engine call per distinct sampling options."""
        ready = []
        for r in batch:
            try:
                self._prepare(r)
                self._check_length(r)
                ready.append(r)
            except Exception as exc:  # a bad request fails alone, not its batch
                r.result = exc
        groups: dict[str, list[ChatRequest]] = {}
        for r in ready:
            groups.setdefault(repr(dataclasses.astuple(r.params)), []).append(r)
        for group in groups.values():
            params = group[0].params
            if all(r.row_id is not None for r in group):
                params = dataclasses.replace(params, row_ids=[r.row_id for r in group])
            try:
                completions = self.engine.generate([r.input_ids for r in group], params)
                self.engine_calls += 1
            except Exception as exc:
                for r in group:
                    r.result = exc
                continue
            for r, c in zip(group, completions):
                r.result = self._record(r, c)

    def _prepare(self, r: ChatRequest) -> None:
        """Find the parent call and the input ids (:mod:`ardea.agent.conversation`)."""
        messages = r.messages
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        if r.parent is not None:  # named by the caller: it must be what the messages continue
            last = len(r.parent.info["messages"])
            if messages[: last + 1] != [*r.parent.info["messages"], r.parent.info["reply"]]:
                reason = "its messages do not start with that call's messages and reply"
                raise rewrite_error(r.parent, reason)
            parent = r.parent
        else:
            parent = self._parent(messages[: last + 1]) if last >= 0 else None
        asked = self._prompts.get(message_key(messages[:last])) if last >= 0 else None
        if parent is None and asked is not None:
            self._rewritten(asked, f"its assistant message {last} differs from that call's reply")
        elif parent is not None:
            r.parent = parent  # with new_trajectory, export splits the conversation here
            new = messages[last + 1 :]
            ids = continuation_ids(self.tokenizer, parent, new, r.tools, self.stop_texts)
            if ids is None:
                self._rewritten(parent, "the chat template rewrote that call's turn")
            r.input_ids = ids or []
        if not r.input_ids:
            text = render(self.tokenizer, messages, r.tools, generation=True)
            r.input_ids = encode(self.tokenizer, text)

    def _check_length(self, r: ChatRequest) -> None:
        room = self.max_positions
        if room is not None and len(r.input_ids) + r.params.max_new_tokens > room:
            raise ContextLengthError(
                f"the prompt has {len(r.input_ids)} tokens; with max_tokens="
                f"{r.params.max_new_tokens} that exceeds the model's context of {room}"
            )

    def _rewritten(self, parent: Interaction, reason: str) -> None:
        if self.history == "error":
            raise rewrite_error(parent, reason)

    def _parent(self, messages: list[dict[str, Any]]) -> Interaction | None:
        """The call whose messages + reply are ``messages`` (one not yet continued first)."""
        with self._lock:
            calls = self._replies.get(message_key(messages), [])
            fresh = [c for c in calls if not c.info["continued"]]
            parent = (fresh or calls[-1:] or [None])[0]
            if parent is not None:
                parent.info["continued"] = True
            return parent

    def _record(self, r: ChatRequest, c: Completion) -> ChatCompletion:
        reply = assistant_reply(self.tokenizer, c, self.stop_ids)
        text, calls = reply.text, reply.tool_calls
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        tool_calls = [
            ChatCompletionMessageToolCall(
                id=f"call_{uuid.uuid4().hex[:12]}",
                type="function",
                function=Function(name=call.name, arguments=_json(call.arguments)),
            )
            for call in calls
        ]
        message = ChatCompletionMessage(
            role="assistant", content=reply.message["content"], tool_calls=tool_calls or None
        )
        reply = normalize(message)
        call = Interaction(
            list(r.input_ids),
            list(c.token_ids),
            list(c.logprobs),
            c.version,
            stop_reason=c.finish_reason,
            parent=r.parent,
            id=completion_id,
            info={
                "messages": r.messages,
                "reply": reply,
                "text": text,
                "continued": False,
                "user": r.user,
            },
        )
        with self._lock:
            self.interactions.append(call)
            self._by_id[completion_id] = call
            self._replies.setdefault(message_key([*r.messages, reply]), []).append(call)
            self._prompts.setdefault(message_key(r.messages), call)
        finish = "tool_calls" if calls else c.finish_reason
        return ChatCompletion(
            id=completion_id,
            object="chat.completion",
            created=int(time.time()),
            model=r.model,
            choices=[
                Choice(
                    index=0,
                    finish_reason=finish,
                    message=message,
                    logprobs=self._logprobs(c) if r.logprobs else None,
                )
            ],
            usage=CompletionUsage(
                prompt_tokens=len(r.input_ids),
                completion_tokens=len(c.token_ids),
                total_tokens=len(r.input_ids) + len(c.token_ids),
            ),
        )

    def _logprobs(self, c: Completion) -> ChoiceLogprobs:
        tokens = self.tokenizer.convert_ids_to_tokens(c.token_ids)
        return ChoiceLogprobs(
            content=[
                ChatCompletionTokenLogprob(token=t, logprob=lp, bytes=None, top_logprobs=[])
                for t, lp in zip(tokens, c.logprobs)
            ]
        )


def _given(value, default):
    return default if value is None else value


def _json(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False)

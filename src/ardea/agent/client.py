"""An OpenAI-compatible chat-completions client over an ardea generation engine, recording
every call as an :class:`~ardea.agent.interaction.Interaction`.

``client.chat.completions.create(messages=..., tools=..., temperature=..., max_tokens=...)``
has the ``openai`` package's signature (the options below) and returns its own
``ChatCompletion``, so agent code written for the OpenAI API runs unchanged, in process or
over HTTP (:mod:`ardea.agent.server`). What it serves:

- the prompt: a request that continues an earlier call is appended to that call's tokens
  (:mod:`ardea.agent.lineage` says which call, :mod:`ardea.agent.conversation` how);
  any other request is the chat template's rendering. ``metadata={"parent_id":
  <completion id>}`` names the call continued, which keeps conversations with equal
  histories apart (their rewards too);
- the reply: the generated text with each well-formed ``<tool_call>`` block moved into
  ``message.tool_calls`` (finish reason ``tool_calls``), behaviour log-probs in
  ``choices[0].logprobs`` when ``logprobs=True``;
- ``stream=True`` (with ``stream_options={"include_usage": True}``): the same reply as
  ``ChatCompletionChunk``s (:mod:`ardea.agent.streaming`), for agent code that always
  streams; ``user`` is recorded in the call's ``info``;
- the record: input ids, output ids, log-probs, the engine's policy version per token,
  stop reason; :meth:`RecordingClient.set_reward` attaches a reward by completion id and
  :meth:`RecordingClient.export` returns the trajectories.

- ``stop`` (up to 16 strings): the reply's text *and* its recorded tokens end at the first
  match (the tokens through the one completing it: what the model sampled is what is
  trained), finish reason ``stop``; ``n`` > 1: several choices of one prompt in the same
  engine call, each recorded as its own call (``<id>:<k>`` names choice ``k``);
- ``tool_choice``: ``auto``; ``none`` (tool-call blocks stay text); ``required`` or a named
  function: the sampled reply is never altered, so one without the required call is
  returned as text and counted (``tool_choice_unmet``); ``parallel_tool_calls=False``: the
  reply ends after its first tool call (tokens cut there, like a stop sequence).

Every request is checked first (:mod:`ardea.agent.request_checks`: a bad one is a
:class:`~ardea.agent.request_checks.RequestError` naming the field), then tokenised in the
caller's thread, outside the engine's batch: one large request cannot stall the others, and
a prompt whose characters alone cannot fit the model's context is refused before it is
tokenised. Penalties and ``logit_bias`` other than neutral, ``top_logprobs`` > 0, content
parts other than text and unknown options are errors naming them. A reply that was never
delivered (the HTTP client went away or retried) is marked an orphan
(:meth:`RecordingClient.mark_orphan`): not continued, not exported, counted.

Batching is the engine's: a call is submitted as soon as it is tokenised
(:mod:`ardea.agent.calls`), and calls made concurrently (threads, the HTTP server's worker
threads) are decoded together, each joining the others at the engine's next decode step
(an in-process engine decodes in the waiting callers' threads). Calls are recorded in the
order they were submitted. While agent workflows run, their calls enter the engine in
lockstep instead (:class:`~ardea.agent.lockstep.Lockstep`).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import threading
import uuid
from types import SimpleNamespace
from typing import Any

from openai.types.chat import ChatCompletion

from ardea.agent.calls import EngineRequest, submit_calls, wait_calls
from ardea.agent.chat_reply import chat_completion, recorded_reply
from ardea.agent.conversation import ChatTemplate, normalize
from ardea.agent.interaction import (
    HISTORY_POLICIES,
    Interaction,
    call_versions,
    export_trajectories,
)
from ardea.agent.lineage import Lineage
from ardea.agent.request_checks import RequestError, check_chat_request, fail
from ardea.agent.streaming import ChunkStream, check_stream_options, completion_chunks
from ardea.agent.tool_parsers import make_tool_parser
from ardea.rollout.engine import GenerationEngine, SamplingParams

PARENT_KEY = "parent_id"  # metadata={"parent_id": <completion id>}: the call this one continues


class ContextLengthError(RequestError):
    """A request's prompt plus ``max_tokens`` does not fit the model's context."""

    def __init__(self, message: str) -> None:
        super().__init__(message, param="messages", code="context_length_exceeded")


@dataclasses.dataclass(eq=False, kw_only=True)
class ChatRequest(EngineRequest):
    """One chat-completions request after checking (module docstring): an
    :class:`~ardea.agent.calls.EngineRequest` (input ids, sampling options, ``n``, row
    id, episode) with what the reply and the record need."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    logprobs: bool = False
    model: str = "ardea"
    stream: bool = False
    include_usage: bool = False  # stream_options={"include_usage": True}
    user: str | None = None
    parent: Interaction | None = None
    result: ChatCompletion | BaseException | None = None
    stop: list[str] = dataclasses.field(default_factory=list)
    tool_choice: str = "auto"  # auto | none | required | a function's name
    parallel_tool_calls: bool = True
    prepared: bool = False
    max_tokens_given: bool = True  # False: the client's default, cut to the context left
    rendered: str | None = None  # the template's text its input ids came from (if kept)
    rewritten: bool = False  # it replaced its parent's reply (keep_tokens: lineage case 3)


class RecordingClient:
    """The recording chat-completions client (module docstring).

    Args:
        engine: generates the replies (its version labels each token).
        tokenizer: its chat template renders requests.
        max_tokens: default ``max_tokens`` of a request.
        temperature: default temperature.
        history: ``error``, ``new_trajectory`` or ``keep_tokens`` (what a request whose
            history was rewritten does: :mod:`ardea.agent.lineage`).
        tool_parser: the model family's tool-call format (:mod:`ardea.agent.tool_parsers`:
            ``hermes``, ``llama3_json``, ``mistral``, ``deepseek_v3``, ``auto`` or a dotted
            path).
    """

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Any,
        *,
        max_tokens: int = 64,
        temperature: float = 1.0,
        history: str = "error",
        tool_parser: str = "hermes",
    ) -> None:
        if history not in HISTORY_POLICIES:
            raise ValueError(f"history={history!r}; choose one of {', '.join(HISTORY_POLICIES)}")
        self.engine = engine
        self.tokenizer = tokenizer
        self.defaults = SamplingParams(temperature=temperature, max_new_tokens=max_tokens)
        self.history = history
        self.max_positions = engine.max_context
        self.template = ChatTemplate(tokenizer, engine.stop_token_ids)
        self._lineages: dict[int | None, Lineage] = {}  # per episode (None: no episode)
        self.tool_parser = make_tool_parser(tool_parser, tokenizer)
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))
        self.interactions: list[Interaction] = []
        self._by_id: dict[str, Interaction] = {}
        self._choices: dict[str, int] = {}  # completion id → its number of choices
        self._lock = threading.Lock()
        self._submitted = itertools.count()  # the order of calls submitted (and recorded)
        self._submit_lock = threading.Lock()
        self._recorded_order: list[tuple[tuple[int, ...], int]] = []  # per interaction
        self._longest_token: int | None = None
        self.tool_choice_unmet = 0  # replies without the call tool_choice required
        self.rewritten_turns_kept = 0  # requests that replaced a reply (keep_tokens kept it)
        self.lockstep = None  # its policy while agent workflows run (:mod:`ardea.agent.lockstep`)

    # ------------------------------------------------------------------ the API
    def create(self, **options: Any) -> ChatCompletion | ChunkStream:
        """``chat.completions.create``: serve one request (decoded with concurrent ones);
        with ``stream=True`` the completion comes as chunks (:mod:`ardea.agent.streaming`)."""
        request = self.request(**options)
        self.prepare(request)  # tokenised here, in the caller's thread
        with self._submit_lock:  # the order of submission is the order of the record
            request.order = (next(self._submitted),)
            submit_calls(self.engine, [request])
        wait_calls(self.engine, [request])
        return self.serve(request)

    def serve(self, request: ChatRequest) -> ChatCompletion | ChunkStream:
        """Record a request whose completions (or error) are in, and return its result."""
        error = request.error
        request.result = error if error is not None else self._record(request)
        return self.result(request)

    def result(self, request: ChatRequest) -> ChatCompletion | ChunkStream:
        """A served request's completion (its chunks with ``stream=True``), or its error
        raised."""
        if isinstance(request.result, BaseException):
            raise request.result
        if request.stream:
            chunks = completion_chunks(request.result, include_usage=request.include_usage)
            return ChunkStream(chunks)
        return request.result

    def request(self, **options: Any) -> ChatRequest:
        """Check a request (:mod:`ardea.agent.request_checks`): a RequestError naming the
        field, a TypeError naming an unsupported option."""
        o = check_chat_request(options)
        stream = bool(o.get("stream"))
        include_usage = check_stream_options(o.get("stream_options"))
        if o.get("stream_options") is not None and not stream:
            raise RequestError(
                "stream_options is only allowed with stream=True", param="stream_options"
            )
        max_tokens = o.get("max_completion_tokens") or o.get("max_tokens")
        params = dataclasses.replace(
            self.defaults,
            temperature=_given(o.get("temperature"), self.defaults.temperature),
            top_p=_given(o.get("top_p"), self.defaults.top_p),
            max_new_tokens=max_tokens or self.defaults.max_new_tokens,
            seed=o.get("seed"),
            stop=o["stop"],  # the engine ends a row there instead of generating to max_tokens
        )
        parent_id = (o.get("metadata") or {}).get(PARENT_KEY)
        return ChatRequest(
            input_ids=[],
            params=params,
            messages=[normalize(m) for m in o["messages"]],
            tools=o["tools"],
            logprobs=bool(o.get("logprobs")),
            model=str(o.get("model") or "ardea"),
            stream=stream,
            include_usage=include_usage,
            user=o.get("user"),
            parent=self._named(parent_id) if parent_id is not None else None,
            stop=o["stop"],
            tool_choice=o["tool_choice"],
            parallel_tool_calls=o.get("parallel_tool_calls") is not False,
            n=o.get("n") or 1,
            max_tokens_given=max_tokens is not None,
        )

    def set_reward(self, completion_id: str, reward: float, choice: int | None = None) -> None:
        """Attach ``reward`` to the call that returned ``completion_id`` (its choice
        ``choice`` when it had several)."""
        key = completion_id if choice is None else f"{completion_id}:{choice}"
        self.get(key).reward = float(reward)

    def get(self, completion_id: str) -> Interaction:
        """The recorded call of a completion id (``<id>:<k>``: its choice ``k``)."""
        n = self._choices.get(completion_id)
        if n is not None and n > 1:
            raise fail("completion_id", f"{completion_id!r} has {n} choices; name one as "
                       f"'{completion_id}:<k>' (k = 0 .. {n - 1}) or with choice")  # fmt: skip
        if completion_id not in self._by_id:
            raise RequestError(
                f"no recorded completion {completion_id!r}", param="completion_id",
                status=404, kind="not_found_error",
            )  # fmt: skip
        return self._by_id[completion_id]

    def alias(self, other_id: str, completion_id: str) -> None:
        """Let ``other_id`` (a response id) name the call of ``completion_id``."""
        with self._lock:
            self._by_id[other_id] = self._by_id[completion_id]

    def mark_orphan(self, completion_id: str) -> None:
        """The reply of ``completion_id`` never reached its client: its calls are not
        continued, not exported, and counted (:attr:`orphans`)."""
        with self._lock:
            for call in self.interactions:
                if call.id == completion_id or call.id.startswith(f"{completion_id}:"):
                    call.orphan = True

    @property
    def orphans(self) -> int:
        """Calls whose reply was never delivered (left out of :meth:`export`)."""
        return sum(c.orphan for c in self.interactions)

    def export(self, *, style: str = "conversation"):
        """The recorded calls as trajectories (:func:`~ardea.agent.export_trajectories`),
        orphans left out."""
        with self._lock:
            calls = [c for c in self.interactions if not c.orphan]
        return export_trajectories(calls, style=style, history=self.history)

    # ------------------------------------------------------------------ serving
    def prepare(self, r: ChatRequest) -> None:
        """The request's parent and input ids (:mod:`ardea.agent.lineage`), checked against
        the context: by characters before tokenising, then by tokens."""
        if r.prepared:
            return
        self._check_characters(r)
        placed = self.lineage(r.episode).place(r.messages, r.tools, r.parent)
        r.input_ids, r.rendered = placed.prompt.input_ids, placed.prompt.rendered
        r.parent, r.rewritten = placed.parent, placed.rewritten
        room = self.max_positions
        if room is not None and not r.max_tokens_given and len(r.input_ids) < room:
            # no max_tokens asked: the default, or what the context has left (as vLLM does)
            left = min(r.params.max_new_tokens, room - len(r.input_ids))
            r.params = dataclasses.replace(r.params, max_new_tokens=left)
        if room is not None and len(r.input_ids) + r.params.max_new_tokens > room:
            raise ContextLengthError(
                f"the prompt has {len(r.input_ids)} tokens; with max_tokens="
                f"{r.params.max_new_tokens} that exceeds the model's context of {room}"
            )
        r.prepared = True

    def _check_characters(self, r: ChatRequest) -> None:
        """Refuse a prompt whose characters alone need more tokens than the context holds
        (a token covers at most as many characters as the vocabulary's longest entry)."""
        if self.max_positions is None:
            return
        if self._longest_token is None:
            self._longest_token = max(len(t) for t in self.tokenizer.get_vocab())
        chars = sum(len(m["content"]) + len(str(m.get("tool_calls", ""))) for m in r.messages)
        chars += len(str(r.tools or ""))  # the template renders the tools' schemas too
        if chars > self.max_positions * self._longest_token:
            raise ContextLengthError(
                f"the messages hold {chars} characters, more than the model's context of "
                f"{self.max_positions} tokens can hold (at most {self._longest_token} "
                "characters a token)"
            )

    def lineage(self, episode: int | None = None) -> Lineage:
        """The calls a request can continue: those of its own episode (the G episodes of a
        row make equal requests; each continues its own calls)."""
        with self._lock:
            if episode not in self._lineages:
                self._lineages[episode] = Lineage(self.template, self.history)
            return self._lineages[episode]

    def _record(self, r: ChatRequest) -> ChatCompletion:
        """Record each choice as a call (at the request's ``order`` among the recorded
        ones); the completion returned to the client."""
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        choices = []
        for k, c in enumerate(r.completions):
            recorded = recorded_reply(self.template, c, r, self.tool_parser)
            kept = recorded.completion
            call = Interaction(
                list(r.input_ids), list(kept.token_ids), list(kept.logprobs),
                call_versions(c, len(kept.token_ids)),
                stop_reason=kept.finish_reason, parent=r.parent,
                id=completion_id if r.n == 1 else f"{completion_id}:{k}", group_id=r.group_id,
                messages=r.messages, reply=recorded.reply, episode=r.episode, user=r.user,
                rendered=r.rendered, rewritten=r.rewritten,
            )  # fmt: skip
            with self._lock:
                at = bisect.bisect_right(self._recorded_order, (r.order, k))
                self._recorded_order.insert(at, (r.order, k))
                self.interactions.insert(at, call)
                self._by_id[call.id] = call
                self.tool_choice_unmet += recorded.unmet
            self.lineage(r.episode).add(call)
            choices.append(recorded)
        self.rewritten_turns_kept += r.rewritten
        self._choices[completion_id] = r.n
        return chat_completion(completion_id, r, choices, self.tokenizer)

    def _named(self, completion_id: str) -> Interaction:
        try:
            return self.get(completion_id)
        except RequestError as exc:  # a field of the request names nothing: a 400
            raise fail(f"metadata.{PARENT_KEY}", exc.detail, code="parent_not_found") from None


def _given(value, default):
    return default if value is None else value

"""Requests on vLLM servers: each one streamed (``"stream": true``) on a thread of its own,
its tokens and log-probs kept as they arrive, so it can be stopped at any token and go on
from there (:class:`StreamedRequests`, the request side of
:class:`~ardea.rollout.engines.vllm.engine.VLLMEngine`). At most ``max_streams`` requests stream at
once (a thread and a connection each); later ones wait in order and start as streams end,
on the threads that served those (``MAX_STREAMS_PER_SERVER`` per server: the largest
``max_num_seqs`` vLLM picks by default, 1,024 on H100-class GPUs and larger, 256 on others,
128 on CPUs; more would only wait in its queue).

A request runs as one or more *segments*: a streamed ``/v1/completions`` call whose prompt
is the request's prompt followed by its tokens so far and whose ``max_tokens`` is what is
left. A segment ends when the server says so (stop or length: the request is done), when
the request is aborted (the stream is closed, which makes vLLM drop it: the request is done
with finish reason "abort"), when its server fails (the next segment goes to another server
from the tokens so far) or when the engine pauses every request for a weight update
(:meth:`StreamedRequests.paused`): the next segment starts once the new weights are loaded,
under the new version, so each token keeps the version that produced it
(``Completion.spans``).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from ardea.rollout.engine import Completion, Request, RequestHandle, SamplingParams
from ardea.rollout.engines.vllm.pool import VLLMServerDown
from ardea.rollout.engines.vllm.server import VLLMServerError
from ardea.rollout.request_state import RequestState

MAX_STREAMS_PER_SERVER = 1024  # vLLM's largest default max_num_seqs (module docstring)


@dataclass(eq=False)
class Running(RequestState):
    """A request being served (:class:`RequestState`): its affinity ``key``, whether a
    segment is being streamed (and its open response, to close it), and why it should
    stop."""

    key: int | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    streaming: bool = False
    aborted: bool = False
    response: Any = None

    def close(self) -> None:
        """Stop the segment being streamed (closing its response ends it at once)."""
        self.stop.set()
        response = self.response
        if response is not None:
            with contextlib.suppress(Exception):
                response.close()


Stream = Callable[[Running, int], "str | None"]
"""``stream(run, version)``: one segment of ``run`` (module docstring), appending its
tokens under ``version``; the finish reason, or None when the segment was stopped."""


class StreamedRequests:
    """The running requests of one engine (module docstring).

    Args:
        stream: serves one segment (:data:`Stream`).
        version: the engine's current policy version.
        servers: how many servers serve the segments (``max_streams`` is
            ``MAX_STREAMS_PER_SERVER`` for each).
    """

    def __init__(self, stream: Stream, version: Callable[[], int], servers: int) -> None:
        self.stream = stream
        self.version = version
        self.max_streams = MAX_STREAMS_PER_SERVER * servers
        self._cond = threading.Condition()
        self._running: set[Running] = set()  # streaming, or waiting for a stream
        self._queued: collections.deque[Running] = collections.deque()
        self._threads = 0
        self._paused = False
        self.in_flight = "resume"

    def submit(self, request: Request, key: int | None) -> RequestHandle:
        """Start ``request`` on a thread of its own, or queue it behind ``max_streams``
        running ones (``key``: its affinity key)."""
        run = Running(RequestHandle(request), key=key)
        with self._cond:
            self._running.add(run)
            if self._threads >= self.max_streams:
                self._queued.append(run)
                return run.handle
            self._threads += 1
        threading.Thread(target=self._work, args=(run,), name="ardea-vllm", daemon=True).start()
        return run.handle

    def abort(self, handles: Sequence[RequestHandle]) -> list[Completion]:
        """Stop the requests of ``handles``; per handle its completion (module docstring)."""
        wanted = {id(h) for h in handles}
        with self._cond:
            for run in self._running:
                if id(run.handle) in wanted:
                    run.aborted = True
                    run.close()
            for run in [r for r in self._queued if id(r.handle) in wanted]:
                self._queued.remove(run)  # never started: done at once
                self._running.discard(run)
                run.handle.finish(run.completion("abort", self.version()))
            self._cond.notify_all()
        return [h.result() for h in handles]

    def progress(self, handle: RequestHandle) -> int:
        """The tokens the request of ``handle`` has so far (0 once it is done)."""
        with self._cond:
            return next((len(r.tokens) for r in self._running if r.handle is handle), 0)

    @contextlib.contextmanager
    def paused(self):
        """Every running request stopped between two tokens while the block runs (a weight
        update); they go on after it, from their tokens so far (``in_flight`` "resume") or
        from their prompts ("restart")."""
        with self._cond:
            self._paused = True
            for run in self._running:
                run.close()
            while any(run.streaming for run in self._running):
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._paused = False
                for run in self._running:
                    if self.in_flight == "restart":
                        run.reset()
                self._cond.notify_all()

    def close(self) -> None:
        """Stop every request (they fail)."""
        with self._cond:
            for run in self._running:
                run.aborted = True
                run.close()
            self._cond.notify_all()

    def _work(self, run: Running) -> None:
        """Serve ``run``, then the queued requests one after another (a thread's work)."""
        while run is not None:
            self._serve(run)
            with self._cond:
                if self._queued:
                    run = self._queued.popleft()
                else:
                    run, self._threads = None, self._threads - 1

    def _serve(self, run: Running) -> None:
        try:
            while True:
                with self._cond:
                    while self._paused and not run.aborted:
                        self._cond.wait()
                    if run.aborted:
                        run.handle.finish(run.completion("abort", self.version()))
                        return
                    run.stop.clear()
                    run.streaming = True
                    version = self.version()
                try:
                    finish = self.stream(run, version)
                finally:
                    with self._cond:
                        run.streaming, run.response = False, None
                        self._cond.notify_all()
                if finish is not None:
                    run.handle.finish(run.completion(finish, version))
                    return
        except BaseException as error:  # noqa: BLE001 - the request's caller raises it
            run.handle.finish(None, error)
        finally:
            with self._cond:
                self._running.discard(run)
                self._cond.notify_all()


def row_seed(seed: int, row: int, offset: int = 0) -> int:
    """A 63-bit request seed from the call's seed, a row id and, for a resumed request, the
    tokens it already has (a stable hash)."""
    text = f"{seed}:{row}" if offset == 0 else f"{seed}:{row}:{offset}"
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def completion_body(
    prompt: list[int],
    params: SamplingParams,
    row: int,
    stop_ids: list[int],
    done: int = 0,
    *,
    model: str = "ardea",
) -> dict[str, Any]:
    """The ``/v1/completions`` body of one row (``stop_ids``: the engine's eos ids);
    ``done``: the tokens it already has (a resumed request); ``model``: the served name
    (a LoRA adapter's, :mod:`ardea.rollout.engines.vllm.weights`)."""
    body = {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": params.max_new_tokens - done,
        "min_tokens": max(0, params.min_new_tokens - done),
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "top_k": int(params.top_k) if params.top_k else -1,
        "stop_token_ids": sorted(set(stop_ids) | set(params.stop_token_ids)),
        "stop": list(params.stop),  # the tokens through the one completing it are kept
        "include_stop_str_in_output": True,
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    if params.seed is not None:
        body["seed"] = row_seed(params.seed, row, done)
    return body


def _choice(event: dict[str, Any], url: str, server_log: Callable[[], str]) -> dict[str, Any]:
    """The choice of a streamed event; vLLM streams a failed generation as an error event."""
    if not event.get("choices"):
        raise VLLMServerError(
            f"the vLLM server {url} failed a generation: "
            f"{str(event.get('error', event))[:500]}{server_log()}"
        )
    return event["choices"][0]


def stream_segment(
    http: httpx.Client, url: str, body: dict[str, Any], run: Running, version: int,
    server_log: Callable[[], str],
) -> tuple[str | None, int]:  # fmt: skip
    """Stream ``body`` from ``url`` into ``run`` (its tokens under ``version``): the finish
    reason (None when stopped) and the tokens received; ``server_log()``: the end of the
    server's log for errors, read when one happens (a server logs why after it answers). A
    server that fails or stalls raises :class:`VLLMServerDown`."""
    received, finish = 0, None
    try:
        with http.stream(
            "POST", url + "/v1/completions", json={**body, "stream": True}
        ) as response:
            run.response = response
            if response.status_code != 200:
                response.read()
                raise VLLMServerError(
                    f"the vLLM server {url} answered a generation with HTTP "
                    f"{response.status_code}: {response.text[:500]}{server_log()}"
                )
            for line in _event_lines(response):
                if run.stop.is_set():
                    return None, received
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                choice = _choice(json.loads(line[6:]), url, server_log)
                ids = [int(t) for t in choice.get("token_ids") or ()]
                logprobs = [
                    float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or ()
                ]
                if len(logprobs) != len(ids):
                    raise VLLMServerError(
                        f"a vLLM server returned {len(ids)} tokens but {len(logprobs)} log-probs"
                    )
                run.extend(ids, logprobs, version)
                received += len(ids)
                finish = choice.get("finish_reason") or finish
    except (httpx.HTTPError, httpx.StreamError) as error:
        if run.stop.is_set():  # the stream was closed to stop it
            return None, received
        if isinstance(error, httpx.TimeoutException):
            raise VLLMServerDown(
                f"the vLLM server {url} did not answer a generation within "
                f"{http.timeout.read:.0f} s (rollout.vllm.timeout_s){server_log()}"
            ) from None
        raise VLLMServerDown(
            f"the vLLM server {url} failed a generation: {error}{server_log()}"
        ) from None
    if run.stop.is_set() and finish is None:
        return None, received
    if finish is None:
        raise VLLMServerDown(
            f"the vLLM server {url} ended a generation without a finish reason{server_log()}"
        )
    return ("stop" if finish == "stop" else "length"), received


def _event_lines(response: httpx.Response):
    """The stream's lines, split on b"\n" only: a token's text may hold characters that
    text line splitting also breaks at (U+2028, U+0085, ...), which JSON leaves unescaped."""
    pending = b""
    for chunk in response.iter_bytes():
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from (line.rstrip(b"\r") for line in lines)
    if pending:
        yield pending

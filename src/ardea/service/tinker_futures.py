"""Futures and in-order execution, as the Tinker client expects them.

Every submitted operation answers at once with a ``request_id``; the client then polls
``retrieve_future`` until the result is there. :class:`Futures` holds those results.
:class:`Worker` runs the operations that touch a model's weights on one thread, each
model's in ``seq_id`` order: a training client numbers its requests 1, 2, 3, ... and may
retry one (the same ``seq_id`` again), so a request is queued until its predecessors have
been, and a repeated ``(model, seq_id)`` gets the first one's ``request_id`` and is not run
twice. A failed operation fails its future only: the model and later requests go on; a
request the server refuses before queueing it (a 400) still takes its place in the order
(:meth:`Worker.refuse`), so the requests behind it run. At most ``max_queued`` requests of a
model wait or run at once; past that, or with a ``seq_id`` that far ahead, a request is
refused as busy (429: the SDK sends it again, so its place is not taken).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ardea.service.tinker_wire import Busy, WireError

KEEP_SECONDS = 600.0
MAX_QUEUED = 32
SEEN_PER_MODEL = 1024  # retries answered from memory: the most recent seq_ids of a model


class Futures:
    """``request_id`` -> :class:`concurrent.futures.Future` of the operation's result.

    A settled result is kept :data:`KEEP_SECONDS` after it settled (a client whose poll
    reply was lost polls again), then dropped, so a long run's results do not pile up."""

    def __init__(self) -> None:
        self._futures: dict[str, Future] = {}
        self._settled: dict[str, float] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def new(self) -> tuple[str, Future]:
        with self._lock:
            self._forget(time.monotonic() - KEEP_SECONDS)
            request_id = f"req-{next(self._ids)}"
            future: Future = Future()
            self._futures[request_id] = future
        future.add_done_callback(lambda _f: self._settle(request_id))
        return request_id, future

    def _settle(self, request_id: str) -> None:
        with self._lock:
            self._settled[request_id] = time.monotonic()

    def _forget(self, before: float) -> None:
        for request_id in [r for r, t in self._settled.items() if t < before]:
            del self._settled[request_id], self._futures[request_id]

    def get(self, request_id: str) -> Future | None:
        with self._lock:
            return self._futures.get(request_id)


def settle(future: Future, operation: Callable[[], Any]) -> None:
    """Run ``operation`` and put its result (or its exception) into ``future``."""
    try:
        result = operation()
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the client
        future.set_exception(exc)
    else:
        future.set_result(result)


class Worker:
    """One thread for weight-touching work; per model, operations in ``seq_id`` order."""

    def __init__(self, futures: Futures, max_queued: int = MAX_QUEUED) -> None:
        self.futures = futures
        self.max_queued = max_queued
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-worker")
        self._lock = threading.Lock()
        self._next: dict[str, int] = {}  # model -> the seq_id that runs next
        self._waiting: dict[str, dict[int, tuple[Future, Callable]]] = {}
        self._seen: dict[str, dict[int, str]] = {}  # model -> seq_id -> request_id
        self._queued: dict[str, int] = {}  # model -> requests waiting or running

    def start_model(self, model_id: str, next_seq: int = 1) -> None:
        with self._lock:
            self._next[model_id] = next_seq
            self._waiting[model_id] = {}

    def run(self, operation: Callable[[], Any]) -> str:
        """Queue an operation with no order to keep; returns its ``request_id``."""
        request_id, future = self.futures.new()
        self._pool.submit(settle, future, operation)
        return request_id

    def seen(self, model_id: str, seq_id: int) -> str | None:
        """The ``request_id`` of request ``seq_id`` of ``model_id`` when it came before."""
        with self._lock:
            return self._seen.get(model_id, {}).get(seq_id)

    def run_in_order(self, model_id: str, seq_id: int, operation: Callable[[], Any]) -> str:
        """Queue ``operation`` as request ``seq_id`` of ``model_id`` (see the module doc)."""
        with self._lock:
            seen = self._seen.setdefault(model_id, {})
            if seq_id in seen:
                return seen[seq_id]
            waiting = self._waiting.setdefault(model_id, {})
            nxt = self._next.setdefault(model_id, seq_id)
            queued = self._queued.get(model_id, 0)
            if queued >= self.max_queued or seq_id >= nxt + self.max_queued:
                raise Busy(f"model {model_id} has {queued} requests queued (the limit is "
                           f"{self.max_queued}) or seq_id {seq_id} is that far ahead of the "
                           f"next one, {nxt}: retry shortly")  # fmt: skip
            request_id, future = self.futures.new()
            seen[seq_id] = request_id
            self._queued[model_id] = queued + 1
            future.add_done_callback(lambda _f: self._done(model_id))
            if seq_id < nxt:  # below the counter (a client that restarted): run it now
                self._pool.submit(settle, future, operation)
                return request_id
            waiting[seq_id] = (future, operation)
            while nxt in waiting:
                queued_future, queued_operation = waiting.pop(nxt)
                self._pool.submit(settle, queued_future, queued_operation)
                nxt += 1
            self._next[model_id] = nxt
            for old in [s for s in seen if s < nxt - SEEN_PER_MODEL]:
                del seen[old]
        return request_id

    def refuse(self, model_id: str, seq_id: int, reason: WireError) -> None:
        """Take request ``seq_id``'s place in the order with a failure (the request was
        refused): the requests behind it run, and a retry of it gets the same refusal."""

        def refused() -> Any:
            raise reason

        self.run_in_order(model_id, seq_id, refused)

    def _done(self, model_id: str) -> None:
        with self._lock:
            self._queued[model_id] -= 1

    def call(self, operation: Callable[[], Any]) -> Any:
        """Run ``operation`` on the worker's thread and wait for it (reads of a model's
        weights that must not interleave with a training step)."""
        return self._pool.submit(operation).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

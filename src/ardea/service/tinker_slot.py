"""How a Tinker sampler reaches its engine: one of its own, or a turn on a shared one.

An in-process engine is a view of a module in this process, so every set of sampler weights
gets its own (:class:`Direct`): they decode side by side. An engine in other processes (vLLM
servers) costs a server each, so the samplers of one base model take turns on one
(:class:`EngineSlot`, reached through a :class:`Lease`): the slot holds one set of weights
at a time; a request for another set waits until the requests running on the current one
are done, then the slot loads the new weights into its engine (``update_weights``, the only
way weights reach an engine), or, when they need an engine of another shape (another LoRA
rank or set of adapted modules), closes it and builds that one. Requests are served in the
order they came, so a request never runs on weights older than those it was sent after.

Inflight weights (the SDK's ``kind="inflight"``) change under a running sampler:
:meth:`EngineSlot.publish` loads them at once when the slot holds that sampler's weights,
and requests in flight go on under them (the engine's ``in_flight`` policy).
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from ardea.rollout.engine import GenerationEngine, Request, RequestHandle, Weights

Started = Callable[[list[RequestHandle]], None]
Failed = Callable[[BaseException], None]


class Direct:
    """A sampler's own engine."""

    def __init__(self, engine: GenerationEngine) -> None:
        self.engine = engine

    def start(self, requests: Sequence[Request], started: Started, fail: Failed) -> None:
        started(self.engine.submit_all(requests))

    def publish(self, weights: Weights) -> None:
        """Newer weights of the sampler's (inflight) set."""
        self.engine.update_weights(weights, self.engine.version + 1)

    def close(self) -> None:
        self.engine.close()


@dataclass
class Load:
    """What a slot needs to sample one set of weights: ``layout``, the shape of engine they
    need (None: any); ``weights(layout)``, them for an engine of ``layout``;
    ``engine()``, a new engine already holding them, and its layout."""

    layout: Hashable | None
    weights: Callable[[Hashable], Weights]
    engine: Callable[[], tuple[GenerationEngine, Hashable]]


class EngineSlot:
    """One engine the samplers of a base model take turns on (module docstring); its
    thread builds the engine, switches weights and submits, in the order asked."""

    def __init__(self, name: str = "tinker-engine") -> None:
        self.engine: GenerationEngine | None = None
        self.layout: Hashable | None = None
        self.key: str | None = None  # whose weights the engine holds
        self._closing = False
        self._running = 0
        self._idle = threading.Condition()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def start(self, key: str, load: Callable[[], Load], requests: Sequence[Request],
              started: Started, fail: Failed) -> None:  # fmt: skip
        """Submit ``requests`` on the weights of ``key`` (``load()`` when the engine does
        not hold them); ``started(handles)`` or ``fail(error)`` from the slot's thread."""
        self._queue.put(("start", key, load, (requests, started, fail)))

    def publish(self, key: str, load: Callable[[], Load]) -> None:
        """``key``'s weights changed: loaded now if the engine holds ``key``'s, without
        waiting for its requests; otherwise when ``key`` next samples."""
        self._queue.put(("publish", key, load, None))

    def forget(self, key: str) -> None:
        """``key`` names other weights now: loaded again when it next samples."""
        self._queue.put(("forget", key, None, None))

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            action, key, load, call = item
            try:
                if action == "forget" and self.key == key:
                    self.key = None
                elif action == "publish" and self.key == key:
                    self._load(key, load(), wait=False)
                elif action == "start":
                    if self._closing:
                        raise RuntimeError("the Tinker server is stopping")
                    if self.key != key:
                        self._load(key, load(), wait=True)
                    self._submit(*call)
            except BaseException as exc:  # noqa: BLE001 - the request's future reports it
                if call is not None:
                    call[2](exc)
                else:  # a publish: the next request of that key loads the weights again
                    print(f"ardea tinker: loading the new weights of {key} failed: {exc}",
                          file=sys.stderr, flush=True)  # fmt: skip
        self._close_engine()

    def _load(self, key: str, load: Load, *, wait: bool) -> None:
        if wait:
            with self._idle:
                self._idle.wait_for(lambda: self._running == 0)
        self.key = None  # until the weights are in
        if self.engine is None or load.layout not in (None, self.layout):
            self._close_engine()
            self.engine, self.layout = load.engine()
        else:
            self.engine.update_weights(load.weights(self.layout), self.engine.version + 1)
        self.key = key

    def _submit(self, requests: Sequence[Request], started: Started, fail: Failed) -> None:
        handles = self.engine.submit_all(requests)
        with self._idle:
            self._running += len(handles)
        for handle in handles:
            handle.add_done_callback(self._finished)
        started(handles)

    def _finished(self, _handle: RequestHandle) -> None:
        with self._idle:
            self._running -= 1
            self._idle.notify_all()

    def _close_engine(self) -> None:
        engine, self.engine, self.layout, self.key = self.engine, None, None, None
        if engine is not None:
            engine.close()

    def close(self) -> None:
        """Refuse what is queued, stop the thread and close the engine."""
        self._closing = True
        self._queue.put(None)
        self._thread.join()


class Lease:
    """A sampler's turn on a shared :class:`EngineSlot`."""

    def __init__(self, slot: EngineSlot, key: str, load: Callable[[], Load]) -> None:
        self.slot, self.key, self.load = slot, key, load

    def start(self, requests: Sequence[Request], started: Started, fail: Failed) -> None:
        self.slot.start(self.key, self.load, requests, started, fail)

    def close(self) -> None:  # the slot outlives its samplers
        pass

"""The one scheduler of agents' model calls: which waiting calls go to the engine together,
and when.

Every model call of the agent layer (a chat request to the recording client, in process or
over HTTP; a call of an agent workflow's episode; a turn of the environment runner) is an
:class:`EngineRequest` that waits in a :class:`CallScheduler`. A *policy* says when the
waiting calls form a batch:

- :class:`TimeWindow` (``seconds``): for callers ardea does not know (HTTP clients, user
  threads): the first waiting call waits ``seconds`` for others to join, then every waiting
  call goes;
- :class:`~ardea.agent.lockstep.Lockstep`: the episodes are known; a batch goes once every
  running episode has a call waiting and none on its way, so batches (and samples) do not
  depend on timing.

One thread per scheduler, started by a call and left once the scheduler has been idle for
``IDLE_S`` seconds (or at :meth:`close`), serves the batches one after another with the ``serve`` function it was given (the recording
client's generates and records, so calls are recorded in batch order); callers wait for
their own request in a thread (:meth:`CallScheduler.wait`) or an event loop
(:meth:`CallScheduler.enqueue` with the loop). :func:`generate_together` is the batch's engine work:
one engine call per distinct sampling options, ``n`` rows per request, each request's row of
the call's random numbers when every request names one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ardea.rollout.engine import Completion, GenerationEngine, SamplingParams

IDLE_S = 30.0  # an idle scheduler's thread ends after this long (the next call starts one)


@dataclasses.dataclass(eq=False)
class EngineRequest:
    """One call as the engine takes it: ``input_ids``, sampling ``params``, ``n`` choices,
    its ``row_id`` of the call's random numbers (None: any), the ``episode`` making it and
    its ``number`` among that episode's calls (None outside lockstep). The scheduler fills
    ``completions`` or ``error``."""

    input_ids: list[int]
    params: SamplingParams
    n: int = 1
    row_id: int | None = None
    episode: int | None = None
    number: int | None = None
    group_id: int = 0  # the rollout row its episode plays
    completions: list[Completion] | None = None
    error: BaseException | None = None


def generate_together(engine: GenerationEngine, batch: Sequence[EngineRequest]) -> int:
    """Generate every request of ``batch`` (module docstring), setting each one's
    ``completions`` or ``error``; the number of engine calls made."""
    groups: dict[str, list[EngineRequest]] = {}
    for r in batch:
        groups.setdefault(repr(dataclasses.astuple(r.params)), []).append(r)
    calls = 0
    for group in groups.values():
        params = group[0].params
        if all(r.row_id is not None and r.n == 1 for r in group):
            params = dataclasses.replace(params, row_ids=[r.row_id for r in group])
        prompts = [r.input_ids for r in group for _ in range(r.n)]
        try:
            completions = iter(engine.generate(prompts, params))
            calls += 1
        except Exception as exc:  # the batch's requests fail with it; the scheduler goes on
            for r in group:
                r.error = exc
            continue
        for r in group:
            r.completions = [next(completions) for _ in range(r.n)]
    return calls


@dataclasses.dataclass(eq=False)
class Waiting:
    """A request in the scheduler: when it arrived and how its caller is told."""

    request: EngineRequest
    arrived: float
    event: threading.Event | None = None
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future | None = None

    def done(self) -> None:
        if self.event is not None:
            self.event.set()
        else:
            self.loop.call_soon_threadsafe(_resolve, self.future)


class Policy(Protocol):
    """When waiting calls form a batch (module docstring)."""

    def take(self, waiting: list[Waiting], now: float) -> tuple[list[Waiting], float | None]:
        """The calls to serve now (none: not yet) and, when none, the seconds until it is
        worth asking again (None: until the scheduler is woken)."""
        ...


@dataclasses.dataclass
class TimeWindow:
    """The first waiting call waits ``seconds`` for others, then every waiting call goes."""

    seconds: float

    def take(self, waiting: list[Waiting], now: float) -> tuple[list[Waiting], float | None]:
        if not waiting:
            return [], None
        due = min(w.arrived for w in waiting) + self.seconds
        return (list(waiting), None) if now >= due else ([], due - now)


class CallScheduler:
    """Batches of waiting calls served on one thread (module docstring).

    Args:
        serve: serves one batch of requests (sets each one's completions or error).
        policy: when the waiting calls form a batch.
    """

    def __init__(self, serve: Callable[[list[Any]], None], policy: Policy) -> None:
        self.serve = serve
        self.policy = policy
        self.batches = 0
        self._cond = threading.Condition()
        self._waiting: list[Waiting] = []
        self._thread: threading.Thread | None = None
        self._closed = False

    def wait(self, request: EngineRequest) -> None:
        """Queue ``request`` and block until it is served (its completions or error set)."""
        self.enqueue(request).event.wait()

    def enqueue(
        self, request: EngineRequest, *, loop: asyncio.AbstractEventLoop | None = None
    ) -> Waiting:
        """Queue ``request``; its caller waits on the returned entry's ``event``, or, with
        ``loop`` (an event loop's caller), awaits its ``future``."""
        if loop is None:
            waiting = Waiting(request, time.monotonic(), event=threading.Event())
        else:
            waiting = Waiting(request, time.monotonic(), loop=loop, future=loop.create_future())
        self._add(waiting)
        return waiting

    def wake(self) -> None:
        """Ask the policy again (what it decides on changed: an episode started, ended, sent
        or lost a call)."""
        with self._cond:
            self._cond.notify_all()

    def drop(self, keep: Callable[[EngineRequest], bool]) -> None:
        """Remove the waiting requests for which ``keep`` is false (their callers are gone:
        a timed-out episode's)."""
        with self._cond:
            self._waiting = [w for w in self._waiting if keep(w.request)]
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the serving thread once the current batch is served (waiting calls fail)."""
        with self._cond:
            self._closed = True
            left, self._waiting = self._waiting, []
            self._cond.notify_all()
        for w in left:
            w.request.error = RuntimeError("the call scheduler was closed")
            w.done()

    def _add(self, waiting: Waiting) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the call scheduler was closed")
            self._waiting.append(waiting)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ardea-calls", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                batch, pause = self.policy.take(self._waiting, time.monotonic())
                if not batch and not self._waiting:
                    if not self._cond.wait(IDLE_S) and not self._waiting:
                        self._thread = None  # idle: the next call starts the thread again
                        return
                    continue
                if not batch:
                    self._cond.wait(pause)
                    continue
                taken = {id(w) for w in batch}
                self._waiting = [w for w in self._waiting if id(w) not in taken]
                self._cond.release()
                try:
                    self._serve([w.request for w in batch])
                finally:
                    self._cond.acquire()
                self.batches += 1
                for w in batch:
                    w.done()

    def _serve(self, requests: list[EngineRequest]) -> None:
        try:
            self.serve(requests)
        except BaseException as exc:  # noqa: BLE001  (handed to the callers, never lost)
            for r in requests:
                if r.completions is None and r.error is None:
                    r.error = exc


def _resolve(future: asyncio.Future) -> None:
    if not future.done():  # a cancelled caller (its episode timed out) gets nothing
        future.set_result(None)

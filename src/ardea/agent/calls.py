"""How an agent's model call reaches the engine.

There is one scheduler, the engine's: it decodes every running request together and lets a
new one join at the next decode step (:class:`~ardea.rollout.GenerationEngine`). A model
call of the agent layer (a chat request to the recording client, in process or over HTTP;
a call of an agent workflow's episode; a turn of the environment runner) is an
:class:`EngineRequest`; its ``n`` choices become ``n`` engine requests
(:func:`choice_requests`), submitted as the call comes (:func:`submit_calls`), except while
agent episodes run in lockstep: then they wait until every running episode has a call
waiting and go together (:mod:`ardea.agent.lockstep`).

Random numbers: choice ``k`` of a call samples with row ``row_id · n + k`` of the random
numbers of its seed (row ``k`` when the call names no row), so a seeded call samples the
same tokens alone or beside others; an unseeded one draws fresh ones.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence

from ardea.rollout.engine import (
    Completion,
    GenerationEngine,
    Request,
    RequestHandle,
    SamplingParams,
)


@dataclasses.dataclass(eq=False)
class EngineRequest:
    """One call as the engine takes it: ``input_ids``, sampling ``params``, ``n`` choices,
    its ``row_id`` of its seed's random numbers (None: rows 0 .. n−1), the ``episode``
    making it and its ``number`` among that episode's calls (None outside lockstep).
    Submitting it sets ``handles`` (one per choice); then ``completions`` or ``error``.
    ``order``: where a recording client records its choices among its calls (the order
    the calls were submitted in)."""

    input_ids: list[int]
    params: SamplingParams
    n: int = 1
    row_id: int | None = None
    episode: int | None = None
    number: int | None = None
    group_id: int = 0  # the rollout row its episode plays
    order: tuple[int, ...] = ()
    handles: list[RequestHandle] | None = None
    completions: list[Completion] | None = None
    error: BaseException | None = None


def choice_requests(call: EngineRequest) -> list[Request]:
    """The engine requests of ``call``'s choices (module docstring)."""
    first = 0 if call.row_id is None else call.row_id * call.n
    params = dataclasses.replace(call.params, n=1, row_ids=None)
    return [Request(list(call.input_ids), params, first + k) for k in range(call.n)]


def submit_calls(engine: GenerationEngine, calls: Sequence[EngineRequest]) -> None:
    """Submit ``calls`` together (:meth:`~ardea.rollout.GenerationEngine.submit_all`),
    setting each one's ``handles``; a refused submission is every call's ``error``."""
    try:
        handles = iter(engine.submit_all([r for c in calls for r in choice_requests(c)]))
    except Exception as exc:  # noqa: BLE001 - handed to the callers, never lost
        for call in calls:
            call.handles, call.error = [], exc
        return
    for call in calls:
        call.handles = [next(handles) for _ in range(call.n)]


def wait_calls(engine: GenerationEngine, calls: Sequence[EngineRequest]) -> None:
    """Wait for submitted ``calls`` (an in-process engine decodes in this thread
    meanwhile), setting each one's ``completions`` or ``error``."""
    try:
        engine.wait([h for c in calls for h in c.handles or []])
    except Exception:  # noqa: BLE001, S110 - each call's own error is set below
        pass
    for call in calls:
        collect(call)


def collect(call: EngineRequest) -> None:
    """Set a call's ``completions`` from its done handles, or its ``error``."""
    if call.error is not None:
        return
    try:
        call.completions = [h.result() for h in call.handles or []]
    except Exception as exc:  # noqa: BLE001 - handed to the caller
        call.error = exc


def when_done(call: EngineRequest, callback: Callable[[], None]) -> None:
    """Call ``callback()`` once every handle of a submitted ``call`` is done (at once when
    it has none: its submission failed), in the thread that finishes the last one."""
    handles = call.handles or []
    left = [len(handles)]
    lock = threading.Lock()

    def one_done(_handle: RequestHandle) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            callback()

    if not handles:
        callback()
    for handle in handles:
        handle.add_done_callback(one_done)

"""Lockstep admission of agents' model calls: the calls of a known set of running agent
episodes enter the engine together and the same way every time.

An agent workflow (:mod:`ardea.agent.workflows`) calls the model whenever its code gets
there. Submitted as they come (:mod:`ardea.agent.calls`, what
:class:`~ardea.agent.client.RecordingClient` does for callers it does not know), the calls
would share decode steps according to how fast the code between them ran, and a row's
logits (in their last bits) with them, so two runs of the same step could differ. Here the
episodes are known (:meth:`Lockstep.start`, :meth:`Lockstep.finish`), and the rule is:

    the waiting calls are submitted to the engine, together and in (episode, call number)
    order, once every running episode has a call waiting and none on its way (made by the
    code but not yet received, or still being tokenised).

A release therefore holds the next call of every episode still running, whatever the
timing of its code, tools or transport, and enters an engine with none of the episodes'
calls running: one turn of the environment runner, which plays its turns through the same
rule (:mod:`ardea.agent.episodes`). There is no thread: whoever completes the rule (the
last call to arrive, an episode that ends) submits the release. Randomness
follows the episode, not the batch: an episode's ``k``-th call samples with the engine seed
``sampling_seed(seed, *index, k)`` (``index``: the rollout call's seed index) and the
episode's own row of that seed's random numbers (its row id), so a workflow that plays an
environment's game makes the calls, and samples the tokens, of the
:class:`~ardea.agent.episodes.EpisodeRunner` playing it. A call is numbered when the
episode's client sends it (:meth:`Lockstep.issue`, called by the client's transport, in
the order the code makes its calls, ``asyncio.gather`` included), so its samples do not
depend on when it arrives.

With ``locked`` sampling (training) a request may leave out ``temperature`` and ``top_p``
or give the run's own: the trainer's ratio assumes the distribution of ``rollout.*``, so
any other value is a :class:`~ardea.agent.request_checks.RequestError` naming it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ardea.agent.calls import EngineRequest, collect, submit_calls, when_done
from ardea.agent.request_checks import RequestError
from ardea.rollout import GenerationEngine, SamplingParams, sampling_seed

if TYPE_CHECKING:  # a type only: an environment's run never imports the client (openai)
    from ardea.agent.client import RecordingClient

EPISODE_HEADER = "x-ardea-episode"  # the header naming a request's episode over HTTP
CALL_HEADER = "x-ardea-call"  # its number among the episode's calls, given when it was made


def _nothing() -> None:
    pass


class Lockstep:
    """The lockstep policy and its episodes' bookkeeping (module docstring).

    Args:
        seed: the run seed; ``index``: the rollout call's seed index (a tuple of ints).
        rows: each episode's row id (its row of every call's random numbers).
        groups: each episode's group (the row of the rollout it plays).
        sampling: the run's sampling options (what a request's defaults are).
        locked: refuse a request whose temperature or top_p is not the run's.
    """

    def __init__(
        self,
        *,
        seed: int,
        index: tuple[int, ...],
        rows: dict[int, int],
        groups: dict[int, int],
        sampling: SamplingParams,
        locked: bool,
    ) -> None:
        self.seed = seed
        self.index = index
        self.rows = rows
        self.groups = groups
        self.sampling = sampling
        self.locked = locked
        self.closed = False
        self.engine: GenerationEngine | None = None  # where released calls go (:meth:`attach`)
        self.releases = 0  # how many times calls were submitted
        self._lock = threading.Lock()
        self._running: set[int] = set()
        self._calls: dict[int, int] = {}  # episode → calls it made
        self._on_the_way: dict[int, set[int]] = {}  # episode → numbers sent, not yet waiting
        self._waiting: list[tuple[EngineRequest, Callable[[], None]]] = []

    def attach(self, engine: GenerationEngine) -> None:
        """Submit released calls to ``engine``."""
        self.engine = engine

    # ------------------------------------------------------------------ admission
    def arrive(self, call: EngineRequest, on_done: Callable[[], None] = _nothing) -> None:
        """``call`` (tagged: :meth:`tag`) waits for its release; ``on_done()`` once it is
        served (its ``completions`` or ``error`` to be collected: :func:`collect`), in the
        thread that finished it."""
        with self._lock:
            if self.closed:
                raise RuntimeError("the lockstep was closed")
            self._waiting.append((call, on_done))
            self._on_the_way[call.episode].discard(call.number)
        self._release()

    def _release(self) -> None:
        """Submit the waiting calls if the rule holds (module docstring)."""
        with self._lock:
            waiting = self._waiting
            if not waiting or any(self._on_the_way[e] for e in self._running):
                return
            if not self._running <= {c.episode for c, _ in waiting}:
                return
            self._waiting = []
            self.releases += 1
        waiting.sort(key=lambda w: (w[0].episode, w[0].number))
        for call, _ in waiting:
            call.order = (self.releases, call.episode, call.number)
        submit_calls(self.engine, [call for call, _ in waiting])
        for call, on_done in waiting:
            when_done(call, on_done)

    # ------------------------------------------------------------------ the episodes
    def start(self, episode: int) -> None:
        """``episode`` is running: releases wait for its calls."""
        with self._lock:
            self._running.add(episode)
            self._calls.setdefault(episode, 0)
            self._on_the_way.setdefault(episode, set())

    def again(self, episode: int, failed: int) -> None:
        """``episode`` plays ``failed``'s row again (a retry): the same row id and group,
        so its calls sample ``failed``'s random numbers; it is running from now on."""
        with self._lock:
            self.rows[episode] = self.rows[failed]
            self.groups[episode] = self.groups[failed]
        self.start(episode)

    def issue(self, episode: int) -> int:
        """Number the call ``episode`` is sending (its transport calls this): releases wait
        for it to arrive."""
        with self._lock:
            number = self._calls[episode]
            self._calls[episode] += 1
            self._on_the_way[episode].add(number)
            return number

    def lost(self, episode: int, number: int) -> None:
        """Call ``number`` of ``episode`` will not arrive (its sending failed)."""
        with self._lock:
            self._on_the_way[episode].discard(number)
        self._release()

    def finish(self, episode: int) -> None:
        """``episode`` ended (returned, failed or timed out): releases no longer wait for
        it, and a call of it still waiting is dropped (its caller is gone)."""
        with self._lock:
            self._running.discard(episode)
            self._waiting = [w for w in self._waiting if w[0].episode != episode]
        self._release()

    def close(self) -> None:
        """Refuse every later call (the driver is done with the episodes, or gave up on
        them); calls still waiting fail."""
        with self._lock:
            self.closed = True
            left, self._waiting = self._waiting, []
        for call, on_done in left:
            call.error = RuntimeError("the lockstep was closed before the call was served")
            on_done()

    # ------------------------------------------------------------------ the calls
    async def create(
        self, client: RecordingClient, episode: int, options: dict[str, Any], number: int | None
    ):
        """Serve one chat request of ``episode`` on ``client`` (``chat.completions.create``'s
        options), its call ``number`` (None: numbered now): the completion, or its chunks
        when ``stream=True``."""
        with self._lock:
            if self.closed or episode not in self._running:
                raise RequestError(
                    f"{EPISODE_HEADER}: episode {episode} is not running (it ended or timed "
                    "out)", status=409, code="episode_not_running",
                )  # fmt: skip
        if number is None:
            number = self.issue(episode)
        try:
            request = client.request(**options)
            self.tag(request, episode, number)
            if _small(request):  # a thread hop costs more than tokenising a few messages
                client.prepare(request)
            else:
                await asyncio.to_thread(client.prepare, request)
        except BaseException:
            self.lost(episode, number)
            raise
        loop = asyncio.get_running_loop()
        served = loop.create_future()
        self.arrive(request, lambda: _resolve_from_any_thread(loop, served))
        await served
        collect(request)
        return client.serve(request)

    def tag(self, r: EngineRequest, episode: int, number: int) -> None:
        """The request's episode, call number, group, row of random numbers and seed
        (module docstring); a locked run's sampling checked."""
        if self.locked:
            for name in ("temperature", "top_p"):
                asked, run = getattr(r.params, name), getattr(self.sampling, name)
                if asked != run:
                    raise RequestError(
                        f"{name}={asked} differs from this run's rollout.{name}={run}: the "
                        f"trainer's log-probs assume rollout.{name}; leave {name} out of the "
                        "request or change the config",
                        param=name,
                    )
        seed = r.params.seed  # a seed the request gives is kept
        if seed is None:
            seed = sampling_seed(self.seed, *self.index, number)
        r.params = dataclasses.replace(r.params, seed=seed)
        r.row_id = self.rows[episode]
        r.episode, r.number = episode, number
        r.group_id = self.groups[episode]


def _resolve(future: asyncio.Future) -> None:
    if not future.done():  # a cancelled caller (its episode timed out) gets nothing
        future.set_result(None)


def _resolve_from_any_thread(loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> None:
    """Resolve ``future`` on its loop; nothing when the loop has closed (its caller, an
    episode given up with the loop, waits no more)."""
    try:
        loop.call_soon_threadsafe(_resolve, future)
    except RuntimeError:  # the event loop is closed
        pass


def _small(request) -> bool:
    """Whether a request's text is short enough to tokenise on the event loop."""
    chars = sum(len(m.get("content") or "") for m in request.messages)
    return chars + len(str(request.tools or "")) <= 16_384

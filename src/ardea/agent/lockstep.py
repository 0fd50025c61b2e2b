"""The lockstep policy of the call scheduler (:mod:`ardea.agent.scheduler`): the model calls
of a known set of running agent episodes, served together and the same way every time.

An agent workflow (:mod:`ardea.agent.workflows`) calls the model whenever its code gets
there; a time window (what :class:`~ardea.agent.client.RecordingClient` uses for clients it
does not know) would batch calls by how fast the code between them ran, so two runs of
the same step would differ. Here the episodes are known (:meth:`Lockstep.start`,
:meth:`Lockstep.finish`), and the rule is:

    the waiting calls are served, as one batch, once every running episode has a call
    waiting and none on its way (made by the code but not yet received, or still being
    tokenised).

A batch therefore holds the next call of every episode still running, whatever the timing
of its code, tools or transport: one turn of the environment runner, which plays its turns
through the same policy (:mod:`ardea.agent.episodes`). Randomness
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
from typing import Any

from ardea.agent.client import RecordingClient
from ardea.agent.request_checks import RequestError
from ardea.agent.scheduler import CallScheduler, EngineRequest, Waiting
from ardea.rollout import SamplingParams, sampling_seed

EPISODE_HEADER = "x-ardea-episode"  # the header naming a request's episode over HTTP
CALL_HEADER = "x-ardea-call"  # its number among the episode's calls, given when it was made


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
        self.scheduler: CallScheduler | None = None  # whose policy this is (:meth:`drive`)
        self._lock = threading.Lock()
        self._running: set[int] = set()
        self._calls: dict[int, int] = {}  # episode → calls it made
        self._on_the_way: dict[int, set[int]] = {}  # episode → numbers sent, not yet waiting

    def drive(self, scheduler: CallScheduler) -> None:
        """Become ``scheduler``'s policy."""
        self.scheduler = scheduler
        scheduler.policy = self
        scheduler.wake()

    # ------------------------------------------------------------------ the policy
    def take(self, waiting: list[Waiting], now: float) -> tuple[list[Waiting], float | None]:
        """Every waiting call, in (episode, call number) order, once every running episode
        has one waiting and none on its way; otherwise none (until woken)."""
        with self._lock:
            if not waiting or any(self._on_the_way[e] for e in self._running):
                return [], None
            if not self._running <= {w.request.episode for w in waiting}:
                return [], None
        return sorted(waiting, key=lambda w: (w.request.episode, w.request.number)), None

    # ------------------------------------------------------------------ the episodes
    def start(self, episode: int) -> None:
        """``episode`` is running: batches wait for its calls."""
        with self._lock:
            self._running.add(episode)
            self._calls.setdefault(episode, 0)
            self._on_the_way.setdefault(episode, set())
        self._wake()

    def issue(self, episode: int) -> int:
        """Number the call ``episode`` is sending (its transport calls this): batches wait
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
        self._wake()

    def finish(self, episode: int) -> None:
        """``episode`` ended (returned, failed or timed out): batches no longer wait for it,
        and a call of it still waiting is dropped."""
        with self._lock:
            self._running.discard(episode)
        if self.scheduler is not None:
            self.scheduler.drop(lambda r: r.episode != episode)

    def close(self) -> None:
        """Refuse every later call (the driver gave up on the episodes)."""
        self.closed = True

    def _wake(self) -> None:
        if self.scheduler is not None:
            self.scheduler.wake()

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
        waiting = self.scheduler.enqueue(request, loop=asyncio.get_running_loop())
        with self._lock:
            self._on_the_way[episode].discard(number)
        self._wake()
        await waiting.future
        return client.result(request)

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


def _small(request) -> bool:
    """Whether a request's text is short enough to tokenise on the event loop."""
    chars = sum(len(m.get("content") or "") for m in request.messages)
    return chars + len(str(request.tools or "")) <= 16_384

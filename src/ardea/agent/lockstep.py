"""The model calls of a known set of running agent episodes, served together and the same
way every time.

An agent workflow (:mod:`ardea.agent.workflows`) calls the model whenever its code gets
there; a time window (what :class:`~ardea.agent.client.RecordingClient` uses for clients it
does not know) would batch calls by how fast the code between them ran, so two runs of
the same step would differ. Here the episodes are known (:meth:`Lockstep.start`,
:meth:`Lockstep.finish`), and the rule is:

    the waiting calls are served, as one batch, once every running episode has a call
    waiting and none on its way (made by the code but not yet received, or still being
    tokenised).

A batch therefore holds the next call of every episode still running, whatever the timing
of its code, tools or transport, like one turn of the environment runner. Randomness
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

from ardea.agent.client import ChatRequest, RecordingClient
from ardea.agent.request_checks import RequestError
from ardea.rollout import SamplingParams, sampling_seed

EPISODE_HEADER = "x-ardea-episode"  # the header naming a request's episode over HTTP
CALL_HEADER = "x-ardea-call"  # its number among the episode's calls, given when it was made


@dataclasses.dataclass
class _Waiting:
    order: tuple[int, int]  # (episode, its call number): the batch's order
    request: ChatRequest
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


class Lockstep:
    """Serves the calls of running episodes in lockstep (module docstring).

    Args:
        client: records and serves the calls (its engine, tokenizer, lineage).
        seed: the run seed; ``index``: the rollout call's seed index (a tuple of ints).
        rows: each episode's row id (its row of every call's random numbers).
        groups: each episode's group (the row of the rollout it plays).
        sampling: the run's sampling options (what a request's defaults are).
        locked: refuse a request whose temperature or top_p is not the run's.
    """

    def __init__(
        self,
        client: RecordingClient,
        *,
        seed: int,
        index: tuple[int, ...],
        rows: dict[int, int],
        groups: dict[int, int],
        sampling: SamplingParams,
        locked: bool,
    ) -> None:
        self.client = client
        self.seed = seed
        self.index = index
        self.rows = rows
        self.groups = groups
        self.sampling = sampling
        self.locked = locked
        self.closed = False
        self._lock = threading.Lock()
        self._running: set[int] = set()
        self._calls: dict[int, int] = {}  # episode → calls it made
        self._on_the_way: dict[int, set[int]] = {}  # episode → numbers sent, not yet waiting
        self._waiting: list[_Waiting] = []
        self._serving = False

    def start(self, episode: int) -> None:
        """``episode`` is running: batches wait for its calls."""
        with self._lock:
            self._running.add(episode)
            self._calls.setdefault(episode, 0)
            self._on_the_way.setdefault(episode, set())

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
        self._serve_if_ready()

    def finish(self, episode: int) -> None:
        """``episode`` ended (returned, failed or timed out): batches no longer wait for it,
        and a call of it still waiting is dropped."""
        with self._lock:
            self._running.discard(episode)
            self._waiting = [w for w in self._waiting if w.order[0] != episode]
        self._serve_if_ready()

    def close(self) -> None:
        """Refuse every later call (the driver gave up on the episodes)."""
        self.closed = True

    async def create(self, episode: int, options: dict[str, Any], number: int | None = None):
        """Serve one chat request of ``episode`` (``chat.completions.create``'s options),
        its call ``number`` (None: numbered now): the completion, or its chunks when
        ``stream=True``."""
        with self._lock:
            if self.closed or episode not in self._running:
                raise RequestError(
                    f"{EPISODE_HEADER}: episode {episode} is not running (it ended or timed "
                    "out)", status=409, code="episode_not_running",
                )  # fmt: skip
        if number is None:
            number = self.issue(episode)
        try:
            request = self.client.request(**options)
            self._tag(request, episode, number)
            if _small(request):  # a thread hop costs more than tokenising a few messages
                self.client.prepare(request)
            else:
                await asyncio.to_thread(self.client.prepare, request)
        except BaseException:
            self.lost(episode, number)
            raise
        loop = asyncio.get_running_loop()
        waiting = _Waiting((episode, number), request, loop, loop.create_future())
        with self._lock:
            self._on_the_way[episode].discard(number)
            self._waiting.append(waiting)
        self._serve_if_ready()
        await waiting.future
        return self.client.result(request)

    def _tag(self, r: ChatRequest, episode: int, number: int) -> None:
        """The request's episode, group, row of random numbers and seed (module
        docstring); a locked run's sampling checked."""
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
        r.episode = episode
        r.group_id = self.groups[episode]

    def _serve_if_ready(self) -> None:
        """Serve the waiting calls (in a thread) when every running episode has one."""
        with self._lock:
            if self._serving or not self._waiting:
                return
            if any(self._on_the_way[e] for e in self._running):
                return
            if not self._running <= {w.order[0] for w in self._waiting}:
                return
            batch = sorted(self._waiting, key=lambda w: w.order)
            self._waiting = []
            self._serving = True
        threading.Thread(target=self._serve, args=(batch,), daemon=True).start()

    def _serve(self, batch: list[_Waiting]) -> None:
        try:
            self.client.serve_batch([w.request for w in batch])
        except BaseException as exc:  # noqa: BLE001  (handed to the callers, never lost)
            for w in batch:
                w.request.result = exc
        finally:
            with self._lock:
                self._serving = False
            for w in batch:
                w.loop.call_soon_threadsafe(_resolve, w.future)
            self._serve_if_ready()


def _resolve(future: asyncio.Future) -> None:
    if not future.done():  # a cancelled caller (its episode timed out) gets nothing
        future.set_result(None)


def _small(request: ChatRequest) -> bool:
    """Whether a request's text is short enough to tokenise on the event loop."""
    chars = sum(len(m.get("content") or "") for m in request.messages)
    return chars + len(str(request.tools or "")) <= 16_384

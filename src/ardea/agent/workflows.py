"""Agent workflows: the user's own agent code, trained as it is.

A workflow is ``async def run(client, row) -> float | dict``: ``client`` is an
``openai.AsyncOpenAI`` (the real class) whose calls ardea serves and records, ``row`` one
row of the run's data (a JSON object), and the result the episode's reward, or a dict with
``reward`` and other numbers (``success`` becomes ``agent/success_rate``, any other key
``agent/info/<key>``). ``agent.workflow`` names it as ``package.module.function`` or
``path/to/file.py:function``.

:class:`WorkflowRunner` is the :class:`~ardea.rollout.Runner` of such runs:

- ``generate``: ``group_size`` episodes per row, at most ``max_concurrency`` running at a
  time, each with its own client, in an event loop of their own thread. The client talks to
  the recording server (:mod:`ardea.agent.server`) in process (an ASGI transport: no
  socket) or over HTTP on loopback (``transport``), its requests carrying the episode's
  number; the calls enter the engine in lockstep (:mod:`ardea.agent.lockstep`): the same batches
  and the same samples whatever the timing, and a workflow that plays an environment's game
  samples what the environment runner samples.
- A workflow that raises, returns something else, or outlives ``timeout_s`` is a failed
  episode: counted (``agent/workflow_failures``, ``agent/workflow_timeouts``), its calls not
  trained, its first error written once to stderr; ``on_error="fail"`` stops the step with
  the row and the error instead. Code that blocks the event loop (a synchronous sleep) is
  given up on after the episodes' time is spent, never waited for.
- ``score``: the kept calls become trajectories (``export`` style, ``history`` policy),
  each conversation's last call carrying the episode's reward (``export="call"``: every
  call, discounted by ``reward_discount`` per call before the last), one group per row.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import importlib.util
import inspect
import itertools
import math
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import openai

from ardea.agent.client import RecordingClient
from ardea.agent.episode_metrics import episode_metrics
from ardea.agent.episodes import StoredEpisodes
from ardea.agent.http_guard import Guard, ServerLimits
from ardea.agent.interaction import Interaction, discount_rewards, export_trajectories
from ardea.agent.lockstep import EPISODE_HEADER
from ardea.agent.played import Episode, Episodes, Played, Rows
from ardea.agent.server import ChatServer, build_app, openai_error
from ardea.agent.workflow_transport import NumberedTransport, Sessions
from ardea.config.agent import AgentConfig
from ardea.data import TrajectoryBatch
from ardea.errors import ArdeaError, ConfigError
from ardea.registry import import_dotted
from ardea.rollout import GenerationEngine, Rollout

TRANSPORTS = ("in_process", "http")
IN_PROCESS_HOST = "ardea.in-process"
IN_PROCESS_URL = f"http://{IN_PROCESS_HOST}/v1"  # never resolved: the ASGI transport answers
GRACE_S = 30.0  # past the episodes' own time, how long a blocked event loop is waited for


class WorkflowError(ArdeaError):
    """An agent workflow failed under ``reward.on_error=fail``, or every episode failed."""


def load_workflow(spec: str, field: str = "agent.workflow") -> Callable[..., Any]:
    """The async function ``spec`` names: ``package.module.function`` or
    ``path/to/file.py:function`` (a ConfigError naming ``field`` otherwise)."""
    where = f"{field}={spec!r}"
    if ".py:" in spec:
        path, _, name = spec.rpartition(":")
        if not Path(path).is_file():
            raise ConfigError(f"{where}: no file {path!r} (relative to {Path.cwd()})")
        module_spec = importlib.util.spec_from_file_location(Path(path).stem, path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as err:
            raise ConfigError(
                f"{where}: importing {path} failed: {type(err).__name__}: {err}"
            ) from err
        if not hasattr(module, name):
            raise ConfigError(f"{where}: {path} defines no {name!r}")
        fn = getattr(module, name)
    else:
        fn = import_dotted(spec, where)
    call = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn).__call__
    if not inspect.iscoroutinefunction(call):
        raise ConfigError(f"{where}: {fn!r} is not an async function (async def run(client, row))")
    return fn


def workflow_outcome(value: Any) -> tuple[float, dict[str, float]]:
    """``(reward, info)`` of a workflow's result: a number, or a dict with a ``reward``
    number and other numbers or booleans (a ValueError naming what is wrong)."""
    info: dict[str, Any] = {}
    if isinstance(value, dict):
        if "reward" not in value:
            raise ValueError(f"the workflow returned a dict without 'reward': {value!r:.200}")
        info = {k: v for k, v in value.items() if k != "reward"}
        value = value["reward"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"the workflow's reward must be a finite number, got {value!r:.200}")
    for key, v in info.items():
        if isinstance(v, bool) or isinstance(v, int | float) and math.isfinite(v):
            continue
        raise ValueError(f"the workflow's {key!r} must be a finite number or bool, got {v!r:.80}")
    return float(value), {k: float(v) for k, v in info.items()}


class WorkflowRunner(StoredEpisodes):
    """Plays ``group_size`` episodes of an agent workflow per row (module docstring).

    Args:
        engine: the live policy's engine; ``tokenizer``: its chat template renders requests.
        agent: the run's ``agent`` section (:class:`~ardea.config.AgentConfig`):
            ``workflow`` (``package.module.function`` or ``path/to/file.py:function``),
            ``transport`` (``in_process`` or ``http``), ``max_concurrency`` (episodes running
            at once), ``workflow_timeout_s`` (seconds one episode may take), ``export``,
            ``history``, ``tool_parser``, ``reward_discount``.
        locked: a request may not change temperature or top_p (the run's sampling options,
            ``params``, are a request's defaults).
        options: :class:`~ardea.agent.episodes.StoredEpisodes`'s: ``group_size`` (G
            episodes per row), ``params``, ``seed`` (the run seed) and ``on_error``: an
            episode that failed (raised, timed out) is first played again, up to
            ``agent.retries`` times (``agent/retries``); a failure left then: ``mask``
            counts it and leaves its calls out of training, ``fail`` raises
            :class:`WorkflowError` (``zero`` is refused: a failed episode may stop
            mid-conversation, so its calls are never trained).
    """

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Any,
        agent: AgentConfig,
        *,
        locked: bool = True,
        **options: Any,
    ) -> None:
        if agent.transport not in TRANSPORTS:
            raise ConfigError(
                f"agent.transport={agent.transport!r}: choose {' or '.join(TRANSPORTS)}"
            )
        if options.get("on_error", "mask") not in ("mask", "fail"):
            raise ConfigError(
                f"reward.on_error={options['on_error']!r} with an agent workflow: a failed "
                "episode may stop mid-conversation, so its calls are never trained; choose mask "
                "(count it and go on) or fail (stop)"
            )
        super().__init__(engine, tokenizer, agent, **options)
        self.workflow = load_workflow(agent.workflow)
        self.locked = locked
        self._reported: set[str] = set()  # failure messages already written to stderr
        self._episode_ids = itertools.count()
        self._sessions = Sessions()
        # every running episode's calls must reach the server at once (the lockstep waits
        # for them): room for four concurrent calls per episode
        self._limits = ServerLimits(max_in_flight=max(256, 4 * agent.max_concurrency))
        self._app = Guard(build_app(self._sessions), self._limits, IN_PROCESS_HOST, openai_error)
        self._server: ChatServer | None = None  # transport http: started by the first call

    # ------------------------------------------------------------------ generate
    def _play(
        self, examples: Rows, seed_index: Sequence[int] | int, engine: GenerationEngine, first: int
    ) -> Played:
        """Play ``group_size`` episodes of every row (module docstring); the workflow's
        return is the reward."""
        client = RecordingClient(
            engine, self.tokenizer, history=self.agent.history,
            tool_parser=self.agent.tool_parser,
        )  # fmt: skip
        client.defaults = dataclasses.replace(self.params, seed=None, row_ids=None)
        groups = [g for g in range(len(examples)) for _ in range(self.group_size)]
        episodes = {  # by episode id, unique over the runner's calls (they may overlap)
            next(self._episode_ids): Episode(
                None, group, None, [], row_id=first * self.group_size + i
            )
            for i, group in enumerate(groups)
        }
        lockstep = self._lockstep(seed_index, episodes, locked=self.locked)
        client.lockstep = lockstep
        lockstep.attach(client.engine)
        self._sessions.open(client, list(episodes))
        latest = dict(episodes)  # first episode number -> its last attempt (retries)
        try:
            url = self._serving().url if self.agent.transport == "http" else IN_PROCESS_URL
            rounds = math.ceil(len(episodes) / self.agent.max_concurrency)
            rounds *= 1 + self.agent.retries
            drive = self._drive(list(examples), episodes, lockstep, url, client, latest)
            if not _run_in_thread(drive, rounds * self.agent.workflow_timeout_s + GRACE_S):
                lockstep.close()
                for e in episodes.values():
                    if not e.done:
                        e.error = "its event loop was blocked past agent.workflow_timeout_s (a "
                        e.error += "synchronous call in async code?); the episodes were given up"
        finally:
            self._sessions.close(list(episodes))
            lockstep.close()
        calls = self._kept_calls(client.interactions, episodes)
        played = list(latest.values())  # one per first episode, in their order
        self._check_failures(list(examples), played)
        return played, calls, None

    def _serving(self) -> ChatServer:
        """The runner's HTTP server (``transport: http``), started by its first call."""
        if self._server is None:
            self._server = ChatServer(self._sessions, limits=self._limits).start()
        return self._server

    def close(self) -> None:
        """Stop the runner's HTTP server, if it started one."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    async def _drive(
        self, rows, episodes: dict[int, Episode], lockstep, url, recorder,
        latest: dict[int, Episode],
    ) -> None:  # fmt: skip
        """Run every episode, ``max_concurrency`` at a time (in order, as slots free); an
        episode that failed is played again as a new one (added to ``episodes``), its row id
        (so its random numbers) kept, up to ``agent.retries`` times: ``latest`` maps each
        first episode number to its last attempt (the failed ones' calls are not trained)."""
        if self.agent.transport == "in_process":
            inner = httpx.ASGITransport(app=self._app)
        else:  # no pool limit: every running episode's call must reach the server at once
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
            inner = httpx.AsyncHTTPTransport(limits=limits)
        slots = asyncio.Semaphore(self.agent.max_concurrency)
        transport = NumberedTransport(inner, lockstep)
        async with httpx.AsyncClient(transport=transport, timeout=None) as http:

            async def attempt(number: int, episode: Episode) -> None:
                client = openai.AsyncOpenAI(
                    base_url=url, api_key="ardea", http_client=http, max_retries=0,
                    default_headers={EPISODE_HEADER: str(number)},
                )  # fmt: skip
                row = copy.deepcopy(rows[episode.group])
                try:
                    result = await asyncio.wait_for(
                        self.workflow(client, row), self.agent.workflow_timeout_s
                    )
                    episode.reward, episode.info = workflow_outcome(result)
                except TimeoutError:
                    episode.error = f"timed out after {self.agent.workflow_timeout_s:g} s"
                    episode.error += " (agent.workflow_timeout_s)"
                    episode.truncated = True
                except (Exception, SystemExit) as exc:  # the user's code: counted
                    episode.error = _failure(exc)
                finally:
                    episode.done = True

            async def play(number: int, episode: Episode) -> None:
                async with slots:
                    first = number
                    lockstep.start(number)
                    await attempt(number, episode)
                    while episode.error is not None and episode.retries < self.agent.retries:
                        failed, number = number, next(self._episode_ids)
                        episode = Episode(None, episode.group, None, [], row_id=episode.row_id,
                                          retries=episode.retries + 1)  # fmt: skip
                        episodes[number] = latest[first] = episode
                        self._sessions.open(recorder, [number])
                        lockstep.again(number, failed)  # before the failed one leaves
                        lockstep.finish(failed)
                        await attempt(number, episode)
                    lockstep.finish(number)

            await asyncio.gather(*(play(n, e) for n, e in episodes.items()))

    def _kept_calls(
        self, calls: list[Interaction], episodes: dict[int, Episode]
    ) -> list[Interaction]:
        """The calls of episodes that ended well (not orphans), the last call of each
        conversation carrying its episode's reward; the episodes' counts filled in."""
        parents = {id(c.parent) for c in calls if c.parent is not None}
        kept = []
        for call in calls:
            episode = episodes[call.episode]
            if episode.error is not None or call.orphan:
                continue
            kept.append(call)
            episode.turns += 1
            episode.tool_calls += len(call.reply.calls)
            episode.rewritten_turns += call.rewritten
            episode.messages = [*call.messages, call.reply.message]
            call.reward = episode.reward if id(call) not in parents else 0.0
            episode.truncated |= call.stop_reason == "length" and id(call) not in parents
        for episode in episodes.values():
            episode.success = bool(episode.info.get("success", 0.0))
        return kept

    def _check_failures(self, rows: list[dict[str, Any]], episodes: list[Episode]) -> None:
        """Failed episodes: an error under on_error=fail or when all failed; else the first
        new message written once to stderr."""
        failed = [e for e in episodes if e.error is not None]
        if not failed:
            return
        first = failed[0]
        where = f"agent workflow {self.agent.workflow} failed on row {rows[first.group]!r:.200}"
        if self.on_error == "fail" or len(failed) == len(episodes):
            why = "every episode failed" if len(failed) == len(episodes) else "reward.on_error=fail"
            raise WorkflowError(
                f"{where} ({why}; {len(failed)} of {len(episodes)} episodes): {first.error}"
            )
        headline = first.error.splitlines()[0] if first.error else ""
        if headline not in self._reported:
            self._reported.add(headline)
            print(f"ardea: {where} ({len(failed)} of {len(episodes)} episodes, counted in "
                  f"agent/workflow_failures, not trained): {first.error}", file=sys.stderr)  # fmt: skip

    # ------------------------------------------------------------------ score
    def score(self, played: Episodes) -> Rollout:
        """The kept calls' trajectories and the ``agent/*`` metrics (module docstring)."""
        calls = played.calls
        if self.agent.export == "call":
            discount_rewards(calls, self.agent.reward_discount)
        rows = export_trajectories(calls, style=self.agent.export, history=self.agent.history)
        if not rows:
            raise WorkflowError(
                f"agent workflow {self.agent.workflow} made no model call that produced tokens in "
                f"{len(played.episodes)} episodes: nothing to train"
            )
        batch = TrajectoryBatch.from_trajectories(
            rows, pad_token_id=self.tokenizer.pad_token_id, **self.params.logprob_sampling
        )
        return Rollout(batch, workflow_metrics(played, batch), self._samples(played))


def workflow_metrics(played: Episodes, batch: TrajectoryBatch) -> dict[str, float]:
    """``episode_metrics`` of the episodes that ended well, plus the failures' fractions and
    the means of the workflows' own numbers (``agent/info/<key>``)."""
    episodes = played.episodes
    good = [e for e in episodes if e.error is None]
    metrics = episode_metrics(good, batch)
    if not any("success" in e.info for e in good):
        del metrics["agent/success_rate"]  # the workflow does not say what success is
    metrics["agent/workflow_failures"] = (len(episodes) - len(good)) / len(episodes)
    metrics["agent/retries"] = sum(e.retries for e in episodes) / len(episodes)
    timeouts = sum(bool(e.error and "agent.workflow_timeout_s" in e.error) for e in episodes)
    metrics["agent/workflow_timeouts"] = timeouts / len(episodes)
    rewritten = sum(e.rewritten_turns for e in good)
    metrics["agent/rewritten_turns_kept"] = rewritten / max(len(good), 1)
    for key in sorted({k for e in good for k in e.info if k != "success"}):
        values = [e.info[key] for e in good if key in e.info]
        metrics[f"agent/info/{key}"] = sum(values) / len(values)
    metrics["perf/generate_tokens_per_s"] = float(batch.loss_mask.sum()) / max(played.seconds, 1e-9)
    return metrics


def _failure(exc: BaseException) -> str:
    """``Type: message`` and the innermost frames of the workflow's traceback."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = "".join(traceback.format_list(frames)).rstrip()
    return f"{type(exc).__name__}: {exc}\n{where}"


def _run_in_thread(coroutine, deadline_s: float) -> bool:
    """Run ``coroutine`` in a new event loop on its own thread (the caller may be inside a
    loop already); False when it did not end within ``deadline_s`` (left running)."""
    box: dict[str, BaseException] = {}

    def run() -> None:
        try:
            asyncio.run(coroutine)
        except BaseException as exc:  # noqa: BLE001  (raised in the caller's thread)
            box["error"] = exc

    thread = threading.Thread(target=run, name="ardea-workflows", daemon=True)
    thread.start()
    thread.join(deadline_s)
    if "error" in box:
        raise box["error"]
    return not thread.is_alive()

"""G episodes per environment row, played on the engine and scored into one
:class:`~ardea.data.TrajectoryBatch`: the agent counterpart of
:class:`~ardea.rollout.RolloutRunner`, with the same two calls.

- :meth:`EpisodeRunner.generate`: every episode of the call starts (``env.reset(row)``)
  a :class:`~ardea.agent.conversation.Conversation`; then, turn after turn, **all episodes
  waiting for the model are generated together**: each hands its next call to the lockstep
  that admits agent workflows' calls (:mod:`ardea.agent.lockstep`), which submits them to
  the engine together once every playing episode's call is there (an in-process engine
  then decodes them in this thread); each reply goes to its environment (``env.step``),
  whose observation joins the conversation, until every episode is done, hit ``max_turns`` or no longer fits
  the engine's context. An episode's ``k``-th call samples with the engine seed
  ``sampling_seed(seed, *index, k)`` and its own row of that call's random numbers (its row
  id ``first_prompt * G + i``, whichever episodes are still playing), so an episode is the
  same whether one process plays the whole rollout or it is split over several. An
  episode whose environment raises is played again from a fresh environment with the same
  row and row id (``agent.retries`` times at most, counted in ``agent/retries``): the same
  random numbers, so a failure that does not recur leaves the episode as it would have
  been, and the group keeps its G episodes instead of training on the ones that survived.
- :meth:`EpisodeRunner.score`: the recorded calls become trajectories
  (:func:`~ardea.agent.export_trajectories`, ``export`` style and ``history`` policy), one
  group per row (``group_ids``: the row's index in the call), with the ``agent/*`` metrics
  of ``docs/reference/metrics.md``.

Every generated span carries the engine version that produced it, so the trainer's
staleness check sees a version per span.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ardea.agent.calls import EngineRequest, wait_calls
from ardea.agent.conversation import ChatTemplate, Conversation, normalize
from ardea.agent.env import make_env
from ardea.agent.episode_metrics import episode_metrics, message_text
from ardea.agent.interaction import Interaction, discount_rewards, export_trajectories
from ardea.agent.lockstep import Lockstep
from ardea.agent.played import (
    Episode,
    Episodes,
    Played,
    Rows,
    episodes_state,
    join_episodes,
    restore_episodes,
)
from ardea.agent.reward_terms import add_reward_terms
from ardea.agent.tool_parsers import make_tool_parser
from ardea.config.agent import AgentConfig
from ardea.data import TrajectoryBatch
from ardea.errors import ArdeaError, ConfigError
from ardea.reward import RewardScorer, failure_metrics
from ardea.rollout import GenerationEngine, Rollout, SamplingParams

SAMPLES_KEPT = 4  # episodes per call kept for samples.jsonl


def _failure(where: str, error: Exception) -> str:
    return f"{where} raised {type(error).__name__}: {error}"


class EnvironmentFailure(ArdeaError):
    """An agent environment raised (under ``reward.on_error=fail``, or in every episode)."""


class StoredEpisodes:
    """What the runners of episodes (an environment's, a workflow's) share: the engine, the
    run's ``agent`` section, G, the sampling options, the seed and ``reward.on_error``; the
    lockstep a call's episodes sample in; their rows identify a call, and played episodes
    are checkpointed as plain lists and dicts."""

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Any,
        agent: AgentConfig,
        *,
        group_size: int,
        params: SamplingParams,
        seed: int = 0,
        on_error: str = "mask",
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.agent = agent
        self.group_size = group_size
        self.params = params
        self.seed = seed
        self.on_error = on_error

    def _lockstep(
        self, seed_index: Sequence[int] | int, episodes: dict[int, Episode], *, locked: bool
    ) -> Lockstep:
        """The lockstep of one call's ``episodes`` (by episode number), seeded by the run
        seed, the call's ``seed_index`` and each episode's global row."""
        index = (seed_index,) if isinstance(seed_index, int) else tuple(seed_index)
        return Lockstep(
            seed=self.seed, index=index, sampling=self.params, locked=locked,
            rows={n: e.row_id for n, e in episodes.items()},
            groups={n: e.group for n, e in episodes.items()},
        )  # fmt: skip

    def encode(self, examples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """What identifies a call's rows (for checkpoints): the rows themselves."""
        return [dict(e) for e in examples]

    def generate(
        self,
        examples: Sequence[dict[str, Any]],
        *,
        seed_index: Sequence[int] | int,
        engine: GenerationEngine | None = None,
        first_prompt: int = 0,
        score: bool = True,
    ) -> Episodes:
        """Play ``group_size`` episodes of every row with ``engine`` (default: the runner's);
        ``first_prompt``: the index of ``examples[0]`` in a rollout split over processes.
        Episodes are always scored as they are played (``score`` is the runners' protocol's:
        reward terms, a workflow's return). Groups are numbered in the whole rollout (from
        ``first_prompt``), so that shares :meth:`join` into it."""
        start = time.perf_counter()
        played, calls, scored = self._play(
            examples, seed_index, engine or self.engine, first_prompt
        )
        for episode in played:
            episode.group += first_prompt
        for call in calls:
            call.group_id += first_prompt
        return Episodes(list(examples), played, calls, time.perf_counter() - start, scored)

    def score_rewards(self, played: Episodes) -> None:
        """Nothing to do: episodes are scored as they are played."""

    @staticmethod
    def join(parts: Sequence[Episodes]) -> Episodes:
        """One call's episodes from a rollout's shares (:func:`join_episodes`)."""
        return join_episodes(parts)

    def _play(
        self, examples: Rows, seed_index: Sequence[int] | int, engine: GenerationEngine, first: int
    ) -> Played:
        """The played episodes of ``examples``, their kept calls and the call's metrics."""
        raise NotImplementedError

    def generation_state(self, played: Episodes) -> dict[str, Any]:
        """For checkpoints of runs with background rollouts (:func:`episodes_state`)."""
        return episodes_state(played)

    def restore_generation(self, state: dict[str, Any], examples: list[Any]) -> Episodes:
        """Stored episodes, for the rows the sampler gives their step again."""
        return restore_episodes(state, examples)

    def close(self) -> None:
        """Nothing held between calls (a workflow runner's HTTP server: its own close)."""

    def _samples(self, played: Episodes) -> list[tuple[str, str, float]]:
        """The first episode of the first few rows: its first message and the rest (an
        episode that made no call has none)."""
        out = []
        for episode in played.episodes[:: self.group_size][:SAMPLES_KEPT]:
            if not episode.messages:
                continue
            first, *rest = episode.messages
            shown = "\n".join(f"[{m['role']}] {message_text(m)}" for m in rest)
            out.append((first["content"], shown, episode.reward))
        return out


class EpisodeRunner(StoredEpisodes):
    """Plays ``group_size`` episodes per environment row (module docstring).

    Args:
        engine: the live policy's engine.
        tokenizer: its chat template renders the conversations.
        agent: the run's ``agent`` section: ``env`` (registered name or dotted path) and
            ``env_args``, ``max_turns``, ``export``, ``history``, ``tool_parser``,
            ``executor``, ``reward_discount`` (:class:`~ardea.config.AgentConfig`).
        options: :class:`StoredEpisodes`'s: ``group_size`` (G episodes per row), ``params``
            (sampling parameters of every call, ``max_new_tokens`` per reply), ``seed`` (the
            run seed) and ``on_error``: an environment whose ``reset`` or ``step`` raises (an
            infrastructure failure, not a mistake of the model) is first played again from a
            fresh environment, up to ``agent.retries`` times (``agent/retries``); a failure
            left then: ``mask`` ends the episode, counts it (``agent/env_failures``) and
            leaves its calls out of training; ``fail`` raises :class:`EnvironmentFailure`.
        scorer: the run's reward functions, whose terms join the environment's reward
            (:mod:`ardea.agent.reward_terms`); None: the environment's reward alone.
    """

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Any,
        agent: AgentConfig,
        *,
        scorer: RewardScorer | None = None,
        **options: Any,
    ) -> None:
        if options.get("on_error", "mask") not in ("mask", "fail"):
            raise ConfigError(f"reward.on_error={options['on_error']!r} with an agent environment: "
                              "a crashed episode's calls are never trained; choose mask or fail")  # fmt: skip
        super().__init__(engine, tokenizer, agent, **options)
        self.scorer = scorer  # reward.functions' terms (:mod:`ardea.agent.reward_terms`)
        self.env_args = dict(agent.env_args)
        make_env(agent.env, max_turns=agent.max_turns, **self.env_args)  # checks the options
        self.tool_parser = make_tool_parser(agent.tool_parser, tokenizer)
        self.template = ChatTemplate(tokenizer, engine.stop_token_ids)  # renders = its cost

    def _play(
        self, examples: Rows, seed_index: Sequence[int] | int, engine: GenerationEngine, first: int
    ) -> Played:
        """Play ``group_size`` episodes of every row (module docstring); the reward terms
        are scored here."""
        template = self.template
        if set(engine.stop_token_ids) != template.stop_ids:  # another engine's stop tokens
            template = ChatTemplate(self.tokenizer, engine.stop_token_ids)
        episodes, calls = [], []
        for group, row in enumerate(examples):
            for _ in range(self.group_size):
                row_id = first * self.group_size + len(episodes)
                episodes.append(self._start(row, group, row_id, template))
                self._settle(episodes, len(episodes) - 1, examples, template)
        lockstep = self._lockstep(seed_index, dict(enumerate(episodes)), locked=False)
        lockstep.attach(engine)
        for i in range(len(episodes)):
            lockstep.start(i)
        try:
            while made := self._turn(episodes, engine, lockstep, examples, template):
                calls += made
        finally:
            lockstep.close()
        if all(e.error is not None for e in episodes):
            raise EnvironmentFailure(
                f"the environment {self.agent.env} failed in every episode of the rollout; the "
                f"first: {episodes[0].error}"
            )
        scored = None if self.scorer is None else add_reward_terms(self.scorer, calls, examples)
        kept = [call for episode, call in calls if episode.error is None]
        return episodes, kept, scored

    def _start(self, row: Any, group: int, row_id: int, template, retries: int = 0) -> Episode:
        """A fresh episode of ``row``: a new environment, reset (an episode whose reset
        raised comes back ended, with the error)."""
        env = make_env(self.agent.env, max_turns=self.agent.max_turns, **self.env_args)
        if env.toolbox is not None:
            env.toolbox.executor = self.agent.executor
        try:
            opening = env.reset(row)
        except Exception as exc:  # noqa: BLE001 - the environment's failure, not ours
            return Episode(env, group, None, [], row_id=row_id, done=True, retries=retries,
                           error=_failure("reset", exc))  # fmt: skip
        conversation = Conversation(
            template, opening, env.tools, history=self.agent.history,
            group_id=group, tool_parser=self.tool_parser,
        )  # fmt: skip
        messages = conversation.messages
        return Episode(env, group, conversation, messages, row_id=row_id, retries=retries)

    def _settle(self, episodes: list[Episode], i: int, rows: Rows, template) -> None:
        """Episode ``i`` after its environment may have raised: played again from a fresh
        environment, with the same row and row id (so the same random numbers), while
        ``agent.retries`` allows; a failure left then ends it under ``mask`` (counted, its
        calls not trained) or raises :class:`EnvironmentFailure` under ``fail``."""
        episode = episodes[i]
        while episode.error is not None and episode.retries < self.agent.retries:
            row = rows[episode.group]
            episode = self._start(row, episode.group, episode.row_id, template, episode.retries + 1)
        episodes[i] = episode
        if episode.error is not None and self.on_error == "fail":
            raise EnvironmentFailure(
                f"the environment {self.agent.env} failed on row {rows[episode.group]!r:.200} "
                f"(reward.on_error=fail, after {episode.retries} retries): {episode.error}"
            )

    def _turn(
        self,
        episodes: list[Episode],
        engine: GenerationEngine,
        lockstep: Lockstep,
        rows: Sequence[dict[str, Any]],
        template,
    ) -> list[tuple[Episode, Interaction]]:
        """One turn: the next call of every episode still playing, released together by the
        lockstep (call ``k`` of an episode, its ``k``-th reply: its seed and row of random
        numbers) once the last one arrives or ends, each reply handed to its environment; an
        episode that ends or has played ``max_turns`` leaves the lockstep. None sent: []."""
        sent = []
        for i, episode in enumerate(episodes):
            if not episode.done and episode.turns >= self.agent.max_turns:
                episode.done = episode.truncated = True
            ids = None if episode.done else self._next_input(episode, engine)
            if ids is None:
                lockstep.finish(i)
                continue
            request = EngineRequest(ids, self.params)
            lockstep.tag(request, i, episode.turns)
            lockstep.arrive(request)
            sent.append((i, episode, request))
        wait_calls(engine, [request for _, _, request in sent])  # every one was released
        calls = []
        for i, episode, request in sent:
            if request.error is not None:
                raise request.error
            call = episode.conversation.record(request.input_ids, request.completions[0])
            try:
                self._advance(episode, call)
            except Exception as exc:  # noqa: BLE001 - the environment's failure, not ours
                episode.error, episode.done = _failure("step", exc), True
                self._settle(episodes, i, rows, template)
            calls.append((episode, call))
        return calls

    def _next_input(self, episode: Episode, engine: GenerationEngine) -> list[int] | None:
        """The episode's next input ids, or None when they no longer fit the engine's
        context with a whole reply (the episode ends, truncated)."""
        ids = episode.conversation.next_input()
        room = engine.max_context
        if room is not None and len(ids) + self.params.max_new_tokens > room:
            episode.done = episode.truncated = True
            return None
        return ids

    @staticmethod
    def _advance(episode: Episode, call: Interaction) -> None:
        """Hand the recorded reply, parsed (:class:`~ardea.agent.reply.Reply`), to the
        environment, whose observation joins the conversation."""
        observation, reward, done, info = episode.env.step(call.reply)
        call.reward = float(reward)
        episode.conversation.messages += [normalize(m) for m in observation]
        episode.reward += reward
        episode.turns += 1
        episode.tool_calls += int(info.get("tool_calls", 0))
        episode.tool_errors += int(info.get("tool_errors", 0))
        episode.success = bool(info.get("success", episode.success))
        episode.done = bool(done)

    def score(self, played: Episodes) -> Rollout:
        """The episodes' trajectories and metrics (module docstring)."""
        calls = played.calls
        if self.agent.export == "call" and self.agent.reward_discount < 1.0:
            discount_rewards(calls, self.agent.reward_discount)
        rows = export_trajectories(calls, style=self.agent.export, history=self.agent.history)
        batch = TrajectoryBatch.from_trajectories(
            rows,
            pad_token_id=self.tokenizer.pad_token_id,
            **self.params.logprob_sampling,
        )
        good = [e for e in played.episodes if e.error is None]  # a crashed env: not trained
        metrics = episode_metrics(good, batch)
        n = len(played.episodes)
        metrics["agent/env_failures"] = (n - len(good)) / n
        metrics["agent/retries"] = sum(e.retries for e in played.episodes) / n
        if played.scored is not None:
            metrics |= failure_metrics(played.scored)
        generated = float(batch.loss_mask.sum())
        metrics["perf/generate_tokens_per_s"] = generated / max(played.seconds, 1e-9)
        return Rollout(batch, metrics, self._samples(played))

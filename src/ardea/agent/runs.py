"""The runner of a run's rollouts, chosen in one place (:func:`make_runner`), and what an
agent run (``agent.env`` or ``agent.workflow`` set) changes in a training run.

- the data: the environment's rows (``data.train_size`` of them, seeded by ``data.seed``):
  online strategies play ``rollout.group_size`` episodes of each; SFT trains on the
  environment's demonstration episodes (assistant turns only);
- the rollouts: an :class:`~ardea.agent.episodes.EpisodeRunner` in place of the rollout
  runner, with the same ``generate``/``score`` calls, so the RL step, staleness and
  versions are those of any online run;
- the evaluation: one greedy episode of every held-out row (``data.eval_size`` at most),
  or ``agent.eval_episodes`` sampled ones (the same seed at every evaluation, so two
  evaluations differ by the policy only), logged as ``eval/success_rate``,
  ``eval/reward_mean`` and ``eval/turns_per_episode``.

A workflow run (``agent.workflow``) plays the rows of ``data.path`` (JSON objects, all of
them) with a :class:`~ardea.agent.workflows.WorkflowRunner`, online strategies only, and
evaluates on the rows of ``data.eval_path`` (``data.eval_size`` at most) when it is set.
"""

from __future__ import annotations

import dataclasses
import random
from typing import TYPE_CHECKING, Any

from ardea.config import ArdeaConfig
from ardea.config.reward import RewardConfig
from ardea.data import Task
from ardea.data.chat import tokenize_chat
from ardea.data.records import Record, read_records
from ardea.errors import ConfigError
from ardea.reward import RewardScorer, build_scorer
from ardea.rollout import GenerationEngine, RolloutRunner, Runner, SamplingParams
from ardea.rollout.shares import RolloutShares
from ardea.timing import PhaseTimer

if TYPE_CHECKING:  # the agent layer (openai, fastapi) is imported by agent runs only
    from ardea.agent.episodes import EpisodeRunner
    from ardea.agent.workflows import WorkflowRunner

DEMO_SEED_STREAM = 11  # demonstrations' random stream, apart from the rows'


def agent_rows(config: ArdeaConfig, split: str) -> list[dict[str, Any]]:
    """The environment's ``train`` or ``eval`` rows; a workflow's, those of ``data.path``
    or ``data.eval_path`` (``data.eval_size`` at most; none without an eval path)."""
    agent, data = config.agent, config.data
    if agent.workflow is not None:
        path = data.path if split == "train" else data.eval_path
        rows = [r.data for r in read_records(path)] if path else []
        return rows if split == "train" else rows[: data.eval_size]
    count = data.train_size if split == "train" else data.eval_size
    from ardea.agent import env_class

    return env_class(agent.env).rows(count, data.seed, split=split, **agent.env_args)


def agent_samples(config: ArdeaConfig, tokenizer: Any, kind: str, *, max_length: int) -> list:
    """The training samples of an agent run: rows (online) or demonstrations (SFT)."""
    rows = agent_rows(config, "train")
    if kind == "prompt":
        return rows
    if agent_workflow := config.agent.workflow:
        raise ConfigError(
            f"algo.name={config.algo.name} trains on {kind!r} samples; agent.workflow="
            f"{agent_workflow!r} plays episodes for online strategies (online_grpo, "
            "online_ppo): train SFT on an environment's demonstrations or a data file"
        )
    if kind != "sft":
        raise ConfigError(
            f"algo.name={config.algo.name} trains on {kind!r} samples; an agent.env provides "
            "episodes (online strategies) and demonstrations (sft)"
        )
    from ardea.agent import make_env

    agent = config.agent
    env = make_env(agent.env, max_turns=agent.max_turns, **agent.env_args)
    rng = random.Random(config.data.seed * 1_000_003 + DEMO_SEED_STREAM)
    records = [
        Record({"messages": env.demonstration(row, rng), "tools": env.tools}, "<demonstrations>", i)
        for i, row in enumerate(rows)
    ]
    return [tokenize_chat(tokenizer, r, max_length=max_length) for r in records]


def make_runner(
    config: ArdeaConfig, engine: GenerationEngine, tokenizer: Any, task: Task | None
) -> Runner:
    """The runner the RL step drives on ``engine``: ``rollout.group_size`` episodes per
    environment row (``agent.env``) or workflow episodes per row (``agent.workflow``), else
    that many completions per prompt scored by ``reward.functions``."""
    if config.agent.plays_episodes:
        return episode_runner(config, engine, tokenizer)
    rollout, reward = config.rollout, config.reward
    return RolloutRunner(
        engine,
        tokenizer,
        build_scorer(reward, task),
        group_size=rollout.group_size,
        params=SamplingParams.of(rollout, routed_experts=config.algo.moe_routing_replay),
        chat_template=config.data.chat_template,
        seed=config.trainer.seed,
        # rollout/accuracy by the task's verifier only where the prompts are its own
        task=None if config.data.path else task,
        overlong_buffer=reward.overlong_buffer,
        overlong_penalty=reward.overlong_penalty,
    )


def episode_runner(
    config: ArdeaConfig, engine: GenerationEngine, tokenizer: Any, *, evaluation: bool = False
) -> EpisodeRunner | WorkflowRunner:
    """The episode (or workflow) runner of ``config``; for evaluation,
    ``agent.eval_episodes`` per row (one greedy episode, or that many sampled)."""
    rollout, agent = config.rollout, config.agent
    greedy = evaluation and agent.eval_episodes == 1
    group = agent.eval_episodes if evaluation else rollout.group_size
    params = SamplingParams.of(rollout, greedy=greedy)
    from ardea.agent.episodes import EpisodeRunner
    from ardea.agent.workflows import WorkflowRunner

    common = dict(group_size=group, params=params, seed=config.trainer.seed,
                  on_error=config.reward.on_error)  # fmt: skip
    if agent.workflow is not None:  # evaluation: a workflow may choose its own sampling
        return WorkflowRunner(engine, tokenizer, agent, **common, locked=not evaluation)
    scorer = reward_terms_scorer(config)
    return EpisodeRunner(engine, tokenizer, agent, **common, scorer=scorer)


def reward_terms_scorer(config: ArdeaConfig) -> RewardScorer | None:
    """The scorer of the reward terms an environment run adds to its episodes
    (:mod:`ardea.agent.reward_terms`), or None when ``reward.functions`` is left at its
    default (the environment's reward alone)."""
    if config.reward.functions == RewardConfig().functions:
        return None
    return build_scorer(config.reward, None)


@dataclasses.dataclass
class AgentEvaluation:
    """Greedy episodes of the held-out rows (module docstring)."""

    runner: EpisodeRunner | WorkflowRunner
    rows: list[dict[str, Any]]

    def run(
        self, shares: RolloutShares | None = None
    ) -> tuple[dict[str, float], list[tuple[str, str, float]]]:
        """The metrics and samples of one greedy episode per held-out row; with ``shares``
        each rank of a torchrun job plays its share of the rows and every rank joins them."""
        if shares is None:
            played = self.runner.generate(self.rows, seed_index=0)
        else:
            played = shares.generated(self.runner, self.rows, 0, PhaseTimer())
        rollout = self.runner.score(played)
        m = rollout.metrics
        episodes = played.episodes  # a failed workflow episode scores 0 here
        metrics = {
            "eval/reward_mean": sum(e.reward for e in episodes if e.error is None) / len(episodes),
            "eval/turns_per_episode": m["agent/turns_per_episode"],
        }
        if "agent/success_rate" in m:  # a workflow that reports no success has none
            good = sum(e.success for e in episodes if e.error is None)
            metrics["eval/success_rate"] = good / len(episodes)
        if "agent/workflow_failures" in m:
            metrics["eval/workflow_failures"] = m["agent/workflow_failures"]
        return metrics, rollout.samples

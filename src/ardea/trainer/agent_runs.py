"""What an agent run (``agent.env`` set) changes in a training run.

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
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from ardea.agent import env_class, make_env
from ardea.agent.episodes import EpisodeRunner
from ardea.config import ArdeaConfig
from ardea.data.chat import tokenize_chat
from ardea.data.records import Record
from ardea.errors import ConfigError
from ardea.rollout import GenerationEngine, SamplingParams

DEMO_SEED_STREAM = 11  # demonstrations' random stream, apart from the rows'


def agent_rows(config: ArdeaConfig, split: str) -> list[dict[str, Any]]:
    """The environment's ``train`` or ``eval`` rows."""
    agent, data = config.agent, config.data
    count = data.train_size if split == "train" else data.eval_size
    return env_class(agent.env).rows(count, data.seed, split=split, **agent.env_args)


def agent_samples(config: ArdeaConfig, tokenizer: Any, kind: str, *, max_length: int) -> list:
    """The training samples of an agent run: rows (online) or demonstrations (SFT)."""
    rows = agent_rows(config, "train")
    if kind == "prompt":
        return rows
    if kind != "sft":
        raise ConfigError(
            f"algo.name={config.algo.name} trains on {kind!r} samples; an agent.env provides "
            "episodes (online strategies) and demonstrations (sft)"
        )
    agent = config.agent
    env = make_env(agent.env, max_turns=agent.max_turns, **agent.env_args)
    rng = random.Random(config.data.seed * 1_000_003 + DEMO_SEED_STREAM)
    records = [
        Record({"messages": env.demonstration(row, rng), "tools": env.tools}, "<demonstrations>", i)
        for i, row in enumerate(rows)
    ]
    return [tokenize_chat(tokenizer, r, max_length=max_length) for r in records]


def episode_runner(
    config: ArdeaConfig, engine: GenerationEngine, tokenizer: Any, *, evaluation: bool = False
) -> EpisodeRunner:
    """The episode runner of ``config``; for evaluation, ``agent.eval_episodes`` per row
    (one greedy episode, or that many sampled)."""
    rollout, agent = config.rollout, config.agent
    greedy = evaluation and agent.eval_episodes == 1
    group = agent.eval_episodes if evaluation else rollout.group_size
    params = SamplingParams.of(rollout, greedy=greedy)
    return EpisodeRunner(
        engine,
        tokenizer,
        env=agent.env,
        env_args=agent.env_args,
        group_size=group,
        params=params,
        max_turns=agent.max_turns,
        export=agent.export,
        history=agent.history,
        tool_parser=agent.tool_parser,
        executor=agent.executor,
        reward_discount=agent.reward_discount,
        seed=config.trainer.seed,
    )


@dataclasses.dataclass
class AgentEvaluation:
    """Greedy episodes of the held-out rows (module docstring)."""

    runner: EpisodeRunner
    rows: list[dict[str, Any]]

    def run(self) -> tuple[dict[str, float], list[tuple[str, str, float]]]:
        played = self.runner.generate(self.rows, seed_index=0)
        rollout = self.runner.score(played)
        m = rollout.metrics
        metrics = {
            "eval/success_rate": m["agent/success_rate"],
            "eval/reward_mean": sum(e.reward for e in played.episodes) / len(played.episodes),
            "eval/turns_per_episode": m["agent/turns_per_episode"],
        }
        return metrics, rollout.samples

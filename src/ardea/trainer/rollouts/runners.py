"""The runner of a run's rollouts, chosen in one place: ``rollout.group_size`` episodes per
environment row when ``agent.env`` is set, or workflow episodes per row when
``agent.workflow`` is (:func:`ardea.trainer.rollouts.agent_runs.episode_runner`), else that many
completions per prompt scored by ``reward.functions``."""

from __future__ import annotations

from typing import Any

from ardea.config import ArdeaConfig
from ardea.data import Task
from ardea.reward import build_scorer
from ardea.rollout import GenerationEngine, RolloutRunner, Runner, SamplingParams
from ardea.trainer.rollouts.agent_runs import episode_runner


def make_runner(
    config: ArdeaConfig, engine: GenerationEngine, tokenizer: Any, task: Task | None
) -> Runner:
    """The runner the RL step drives on ``engine`` (module docstring)."""
    if config.agent.env is not None or config.agent.workflow is not None:
        return episode_runner(config, engine, tokenizer)
    rollout, reward = config.rollout, config.reward
    params = SamplingParams.of(rollout)
    return RolloutRunner(
        engine,
        tokenizer,
        build_scorer(reward, task),
        group_size=rollout.group_size,
        params=params,
        chat_template=config.data.chat_template,
        seed=config.trainer.seed,
        # rollout/accuracy by the task's verifier only where the prompts are its own
        task=None if config.data.path else task,
        overlong_buffer=reward.overlong_buffer,
        overlong_penalty=reward.overlong_penalty,
    )

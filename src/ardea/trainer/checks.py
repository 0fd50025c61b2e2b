"""Everything a config names must exist, checked before any work starts.

The config layer checks keys, types and values; the names it holds are resolved here, in
the layer that knows the registries: the strategy (``algo.name``), the generation engine
(``rollout.engine``), the policy loss (``algo.policy_loss``), the task
(``data.task`` with its ``task_args``), every reward function (registered name or dotted
path to user code, imported here; with its ``kwargs``) and the starting model directory
(``model.path``). :func:`ardea.trainer.run` calls :func:`check_config` for a single run and
for every stage of a staged run before the first one starts.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from ardea.config import ArdeaConfig
from ardea.data import make_task
from ardea.model import build_char_tokenizer, check_model_dir, load_tokenizer
from ardea.reward import build_scorer, check_reward_names, get_reward
from ardea.rollout import engine_factory
from ardea.trainer.scorers.teacher import check_same_vocabulary, check_teacher
from ardea.trainer.strategies import OnlineStrategy, strategy_class
from ardea.trainer.strategies.policy_gradient import resolve_policy_loss


def check_config(
    config: ArdeaConfig,
    *,
    model_path: bool = True,
    teacher_path: bool = True,
    deferred: Collection[int] = (),
) -> None:
    """Resolve every name ``config`` gives; ``model_path=False`` skips ``model.path``
    (a stage that starts from an earlier stage's policy), ``teacher_path=False``
    ``algo.teacher.path`` (an earlier stage's model); the reward functions at the
    ``deferred`` indices are checked by name only (their options name an earlier stage's
    model, which does not exist yet: they are checked in full when their stage starts).

    Raises:
        ConfigError: one line naming the key, the value and the known values.
        ModelLoadError: ``model.path`` is not a model directory.
    """
    strategy = strategy_class(config.algo.name)
    engine_factory(config.rollout.engine)
    if config.algo.policy_loss is not None:
        resolve_policy_loss(config.algo.policy_loss, config.algo.ppo)
    reward = config.reward
    if deferred:
        for i in deferred:
            get_reward(reward.functions[i].name)
        kept = [f for i, f in enumerate(reward.functions) if i not in deferred]
        reward = replace(reward, functions=kept) if kept else None
    data = config.data
    task = make_task(data.task, seed=data.seed, **data.task_args) if data.task else None
    agent = config.agent.plays_episodes
    if config.agent.env is not None:  # the environment rewards the episodes
        from ardea.agent import check_env_args  # the agent layer: agent runs only

        check_env_args(config.agent.env, dict(config.agent.env_args))
    elif config.agent.workflow is not None:  # the workflow rewards them
        from ardea.agent.workflows import load_workflow

        load_workflow(config.agent.workflow)
    if reward is None:  # every function names an earlier stage's model
        pass
    elif issubclass(strategy, OnlineStrategy) and not agent:  # online: rollouts are scored
        build_scorer(reward, task)
    else:
        check_reward_names(reward)
    if model_path and config.model.path:
        check_model_dir(config.model.path, what="model.path")
    if teacher_path and config.algo.teacher.path is not None:
        check_teacher(strategy, config)
        path = config.algo.teacher.path
        check_model_dir(path, what="algo.teacher.path")
        if model_path:  # the policy's tokenizer is known: the teacher must share it
            own = load_tokenizer(config.model.path) if config.model.path else build_char_tokenizer()
            check_same_vocabulary(path, load_tokenizer(path), own)

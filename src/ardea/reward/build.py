"""Building a :class:`RewardScorer` from a :class:`RewardConfig`, and checking its names."""

from __future__ import annotations

from ardea.config.reward import RewardConfig, RewardFunctionConfig
from ardea.data.tasks import Task
from ardea.errors import ConfigError
from ardea.reward.builtins import task_reward
from ardea.reward.registry import RewardFn, make_reward
from ardea.reward.scorer import RewardScorer


def build_scorer(config: RewardConfig, task: Task | None) -> RewardScorer:
    """The scorer of ``config``; the ``task`` function scores with ``task``.

    Raises:
        ConfigError: an unknown function or argument (the message names
            ``reward.functions[i]``), or ``task`` named without a task.
    """
    functions = [
        (_bind(spec, f"reward.functions[{i}]", task), spec.weight)
        for i, spec in enumerate(config.functions)
    ]
    return RewardScorer(
        functions, timeout_s=config.timeout_s, on_error=config.on_error, executor=config.executor
    )


def check_reward_names(config: RewardConfig) -> None:
    """Resolve every function of ``config`` but ``task`` (for runs that never score).

    Raises:
        ConfigError: as :func:`build_scorer`: an unknown name, a dotted path that does not
            import, an unknown or missing argument.
    """
    for i, spec in enumerate(config.functions):
        if spec.name != "task":
            _bind(spec, f"reward.functions[{i}]", None)


def _bind(spec: RewardFunctionConfig, where: str, task: Task | None) -> RewardFn:
    kwargs = dict(spec.kwargs)
    if spec.name != "task":
        try:
            return make_reward(spec.name, **kwargs)
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from err
    if task is None:
        raise ConfigError(
            f"{where}.name='task' scores with data.task, but there is no task; "
            "set data.task or name another reward function"
        )
    if kwargs:
        raise ConfigError(
            f"{where}: the 'task' reward takes no kwargs (got {', '.join(kwargs)}); "
            "configure the task with data.task_args"
        )
    return task_reward(task)

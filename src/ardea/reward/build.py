"""Building a :class:`RewardScorer` from a :class:`RewardConfig`."""

from __future__ import annotations

from ardea.config.reward import RewardConfig
from ardea.data.tasks import Task
from ardea.errors import ConfigError
from ardea.reward.builtins import task_reward
from ardea.reward.registry import make_reward
from ardea.reward.scorer import RewardScorer


def build_scorer(config: RewardConfig, task: Task | None) -> RewardScorer:
    """The scorer of ``config``; the ``task`` function scores with ``task``.

    Raises:
        ConfigError: an unknown function or argument (the message names
            ``reward.functions[i]``), or ``task`` named without a task.
    """
    functions = []
    for i, spec in enumerate(config.functions):
        where = f"reward.functions[{i}]"
        kwargs = dict(spec.kwargs)
        if spec.name == "task":
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
            fn = task_reward(task)
        else:
            try:
                fn = make_reward(spec.name, **kwargs)
            except ConfigError as err:
                raise ConfigError(f"{where}: {err}") from err
        functions.append((fn, spec.weight))
    return RewardScorer(functions, timeout_s=config.timeout_s, on_error=config.on_error)

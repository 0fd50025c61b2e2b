"""Configuration of the reward: which functions, their weights and options, and what a
failing function does.

:class:`RewardConfig` is an OmegaConf structured config; ``ardea.reward.build_scorer``
turns it into a ``RewardScorer``. The function names are checked there (the registry
lives in a layer above config); here the values are checked.

YAML::

    reward:
      functions:
        - {name: numeric_match}
        - {name: format_regex, weight: 0.1, kwargs: {pattern: '#### -?\\d+$'}}
      timeout_s: 10.0
      on_error: mask
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ardea.config.fields import check_choices, option
from ardea.errors import ConfigError

ON_ERROR = ("mask", "zero", "fail")
EXECUTORS = ("thread", "process")


def _check_function(where: str, function: Any) -> None:
    name, weight, kwargs = function.name, function.weight, function.kwargs
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(
            f"{where}.name={name!r} must name a reward function (e.g. task, numeric_match) "
            "or a dotted path package.module.function"
        )
    if (
        isinstance(weight, bool)
        or not isinstance(weight, (int, float))
        or not math.isfinite(weight)
    ):
        raise ConfigError(f"{where}.weight={weight!r} must be a finite number")
    if not isinstance(kwargs, dict) and not hasattr(kwargs, "keys"):
        raise ConfigError(f"{where}.kwargs={kwargs!r} must be a mapping of keyword arguments")


@dataclass
class RewardFunctionConfig:
    name: str = field(  # required: no default
        metadata={
            "help": "Reward function by registered name (task, exact_match, numeric_match, "
            "math_verify, format_boxed, format_regex, reward_model, llm_judge) or dotted path "
            "package.module.function."
        }
    )
    weight: float = option(1.0, "Weight of this function in the summed reward (may be negative).")
    kwargs: dict[str, Any] = option(
        help="Keyword arguments of the function, e.g. {pattern: '...'}; unknown ones are errors.",
        factory=dict,
    )

    def __post_init__(self) -> None:
        _check_function("reward.functions[]", self)


@dataclass
class RewardConfig:
    functions: list[RewardFunctionConfig] = option(
        help="Reward functions summed with their weights; 'task' scores with data.task's "
        "own verifier.",
        factory=lambda: [RewardFunctionConfig(name="task")],
    )
    timeout_s: float = option(
        10.0,
        "Seconds one scoring call waits for the reward functions (they run in threads; a "
        "call that takes longer is abandoned and handled per on_error).",
    )
    executor: str = option(
        "thread",
        "Where reward functions run: thread (a call past timeout_s is abandoned and keeps "
        "running) or process (each call in a forked child process, killed at timeout_s; a "
        "function that ends its process fails that call only).",
        choices=EXECUTORS,
    )
    on_error: str = option(
        "mask",
        "A reward function that raises, times out, or returns None, NaN or a wrong length: "
        "'mask' leaves the failed completions out of training (out of their group's baseline "
        "and the loss), 'zero' trains them with reward 0, 'fail' stops the run showing the "
        "sample; mask and zero count them (reward/failed_fraction).",
        choices=ON_ERROR,
    )

    overlong_buffer: int = option(
        0,
        "DAPO soft overlong penalty: over the last this-many tokens before "
        "rollout.max_new_tokens a completion loses up to overlong_penalty, linearly "
        "(0 = off).",
    )
    overlong_penalty: float = option(
        1.0, "Largest overlong penalty, reached by a completion of rollout.max_new_tokens tokens."
    )

    def __post_init__(self) -> None:
        check_choices(self, "reward")
        if (
            isinstance(self.overlong_buffer, bool)
            or not isinstance(self.overlong_buffer, int)
            or self.overlong_buffer < 0
        ):
            raise ConfigError(
                f"reward.overlong_buffer={self.overlong_buffer!r} must be an integer >= 0 "
                "(tokens; 0 = off)"
            )
        if (
            isinstance(self.overlong_penalty, bool)
            or not isinstance(self.overlong_penalty, (int, float))
            or not 0 <= self.overlong_penalty < math.inf
        ):
            raise ConfigError(
                f"reward.overlong_penalty={self.overlong_penalty!r} must be a finite number >= 0"
            )
        if not self.functions:
            raise ConfigError("reward.functions is empty; name at least one, e.g. [{name: task}]")
        converted = []
        for i, function in enumerate(self.functions):
            if isinstance(function, dict):  # convenience when built in Python
                try:
                    function = RewardFunctionConfig(**function)
                except ConfigError as err:
                    message = str(err).replace("reward.functions[]", f"reward.functions[{i}]")
                    raise ConfigError(message) from None
            _check_function(f"reward.functions[{i}]", function)
            converted.append(function)
        self.functions = converted
        if (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, (int, float))
            or not 0 < self.timeout_s < math.inf
        ):
            raise ConfigError(
                f"reward.timeout_s={self.timeout_s!r} must be a positive number of seconds"
            )

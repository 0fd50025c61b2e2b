"""Strategies by registered name: ``seq``, ``sft``, ``dpo``, ``simpo``, ``orpo``, ``kto``,
``reward_model``, ``grpo``, ``online_grpo``, ``online_dpo``, ``online_ppo``."""

from ardea.trainer.strategies import dpo as _dpo  # noqa: F401  (registers "dpo")
from ardea.trainer.strategies import grpo as _grpo  # noqa: F401  (registers "grpo")
from ardea.trainer.strategies import kto as _kto  # noqa: F401  (registers "kto")
from ardea.trainer.strategies import online_dpo as _online_dpo  # noqa: F401  ("online_dpo")
from ardea.trainer.strategies import online_grpo as _online  # noqa: F401  ("online_grpo")
from ardea.trainer.strategies import online_ppo as _online_ppo  # noqa: F401  ("online_ppo")
from ardea.trainer.strategies import reference_free as _free  # noqa: F401  (simpo, orpo)
from ardea.trainer.strategies import reward_model as _rm  # noqa: F401  ("reward_model")
from ardea.trainer.strategies import seq as _seq  # noqa: F401  (registers "seq")
from ardea.trainer.strategies import sft as _sft  # noqa: F401  (registers "sft")
from ardea.trainer.strategies.base import (
    OnlineStrategy,
    Strategy,
    make_strategy,
    register_strategy,
    strategy_class,
    strategy_names,
)

__all__ = [
    "OnlineStrategy",
    "Strategy",
    "make_strategy",
    "register_strategy",
    "strategy_class",
    "strategy_names",
]

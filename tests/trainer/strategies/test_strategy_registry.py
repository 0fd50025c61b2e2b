"""The strategy registry: names, sample kinds, unknown names."""

import pytest
from strategy_testing import TOKENIZER, make_config, tiny_policy

from ardea.errors import ConfigError
from ardea.trainer.strategies import make_strategy, strategy_class, strategy_names


def test_offline_strategies_are_registered_with_their_sample_kinds():
    assert {"seq", "sft", "dpo", "grpo"} <= set(strategy_names())
    kinds = {name: strategy_class(name).sample_kind for name in ("seq", "sft", "dpo", "grpo")}
    assert kinds == {"seq": "text", "sft": "sft", "dpo": "preference", "grpo": "group"}


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ConfigError, match="unknown strategy algo.name='dopo'") as error:
        make_strategy("dopo", tiny_policy(), make_config("dopo"), tokenizer=TOKENIZER)
    for name in ("seq", "sft", "dpo", "grpo"):
        assert name in str(error.value)

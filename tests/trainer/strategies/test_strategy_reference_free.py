"""``simpo`` and ``orpo``: their losses on the policy's length-averaged log-probs equal the
formulas worked out from a naive full forward, no reference model is ever built, and a step
split into micro-batches sums to the whole step's loss, metrics and gradient."""

import math

import pytest
import torch
from strategy_testing import build, tiny_policy
from test_strategy_dpo import naive_sequence_logps, preference_batch, step_loss
from test_strategy_micro_batches import assert_same_step

from ardea.config import ArdeaConfig, load_config
from ardea.errors import ConfigError
from ardea.trainer.strategies import make_strategy
from ardea.trainer.strategies.reference_free import SimPOStrategy


def mean_logps(policy, batch) -> tuple[list[float], list[float]]:
    with torch.no_grad():
        chosen, rejected = (
            naive_sequence_logps(policy, batch, side, "mean").tolist()
            for side in ("chosen", "rejected")
        )
    return chosen, rejected


def test_simpo_on_known_logprobs():
    """-log sigmoid(beta (a_w - a_l) - gamma) averaged over the two pairs, beta 2.5, gamma
    0.3; rewards beta * a; float32 forward against float64 here: 1e-5."""
    policy = tiny_policy(seed=0)
    strategy = build("simpo", policy, beta=2.5, simpo_gamma=0.3)
    batch = preference_batch()
    loss, metrics = step_loss(strategy, batch)
    a_w, a_l = mean_logps(policy, batch)
    expected = [math.log1p(math.exp(-(2.5 * (w - lo) - 0.3))) for w, lo in zip(a_w, a_l)]
    assert loss.item() == pytest.approx(sum(expected) / 2, abs=1e-5)
    assert metrics["train/rewards_chosen"] == pytest.approx(2.5 * sum(a_w) / 2, abs=1e-5)
    assert metrics["train/rewards_accuracies"] == sum(w > lo for w, lo in zip(a_w, a_l)) / 2
    assert metrics["train/logps_rejected"] == pytest.approx(sum(a_l) / 2, abs=1e-5)


def test_orpo_on_known_logprobs():
    """-a_w + lam * -log sigmoid(log odds_w - log odds_l), log odds(a) = a - log(1 - e^a),
    averaged over the pairs, lam 0.2."""
    policy = tiny_policy(seed=0)
    strategy = build("orpo", policy, beta=0.2)
    batch = preference_batch()
    loss, metrics = step_loss(strategy, batch)
    a_w, a_l = mean_logps(policy, batch)

    def odds(a: float) -> float:
        return a - math.log(1 - math.exp(a))

    ratio = [-math.log1p(math.exp(-(odds(w) - odds(lo)))) for w, lo in zip(a_w, a_l)]
    expected = [-w - 0.2 * r for w, r in zip(a_w, ratio)]
    assert loss.item() == pytest.approx(sum(expected) / 2, abs=1e-5)
    assert metrics["train/nll"] == pytest.approx(-sum(a_w) / 2, abs=1e-5)
    assert metrics["train/log_odds_ratio"] == pytest.approx(sum(ratio) / 2, abs=1e-5)


@pytest.mark.parametrize("name", ["simpo", "orpo"])
def test_no_reference_and_micro_batches_add_up(name):
    built = []
    strategy = make_strategy(
        name, tiny_policy(seed=1), _config(name), tokenizer=None,
        make_reference=lambda: built.append(1),
    )  # fmt: skip
    assert not built and strategy.reference is None
    batch = preference_batch(seed=4)
    first, second = (batch.select(torch.tensor(rows)) for rows in ([0, 2], [1, 3]))
    assert_same_step(strategy, batch, [first.trim(), second.trim()],
                     metrics=("train/loss", "train/rewards_margins"))  # fmt: skip


def _config(name: str) -> ArdeaConfig:
    config = ArdeaConfig()
    config.algo.name = name
    return config


def test_defaults_and_options_are_checked_by_name():
    assert build("simpo", tiny_policy()).beta == 2.0
    assert build("orpo", tiny_policy()).beta == 0.1
    assert build("dpo", tiny_policy()).beta == 0.1
    assert isinstance(build("simpo", tiny_policy()), SimPOStrategy)
    with pytest.raises(ConfigError, match="algo.simpo_gamma=1.0 is an option of algo.name=simpo"):
        load_config(None, ["algo.name=orpo", "algo.simpo_gamma=1.0"])
    with pytest.raises(ConfigError, match="algo.dpo_loss / algo.dpo_reduction are options of dpo"):
        load_config(None, ["algo.name=simpo", "algo.dpo_reduction=mean"])

"""Gradient accumulation: splitting a step into two micro-batches (each padded to its own
length) gives the same summed loss, metrics and gradient as one batch."""

import pytest
import torch
from numerics import assert_gradients_close, decoder_gradient_terms, gamma
from strategy_testing import (
    PAD,
    build,
    pad_rows,
    random_rows,
    run_step,
    sft_batch,
    tiny_policy,
)

from ardea.data import PreferenceSample, TrajectoryBatch, collate_preference


def assert_same_step(strategy, whole, parts, metrics=("train/loss",)):
    """The step in ``parts`` sums the same terms as in ``whole``, in another order: metrics
    and gradients agree within float32's bound for that many terms (tests/numerics.py)."""
    one, grads_one = run_step(strategy, [whole])
    two, grads_two = run_step(strategy, parts)
    rows, span = whole.input_ids.shape
    terms = decoder_gradient_terms(strategy.policy.config, rows=rows, span=span)
    assert set(one) == set(two)
    for name in metrics:  # means of per-token values of order one (losses, ratios, margins)
        assert two[name] == pytest.approx(one[name], rel=gamma(terms), abs=gamma(terms)), name
    assert_gradients_close(grads_one, grads_two, terms=terms)


ROWS = random_rows([9, 6, 12, 5, 8], seed=11)
PROMPTS = [4, 2, 7, 1, 3]


@pytest.mark.parametrize("name", ["seq", "sft"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_next_token_strategies(name, smoothing):
    strategy = build(name, tiny_policy(), label_smoothing=smoothing)
    whole = sft_batch(ROWS, PROMPTS)
    parts = [sft_batch(ROWS[:2], PROMPTS[:2]), sft_batch(ROWS[2:], PROMPTS[2:])]
    assert_same_step(strategy, whole, parts)


def preference(pairs) -> TrajectoryBatch:
    """``pairs``: (prompt, chosen response, rejected response) token lists."""
    samples = [PreferenceSample(tuple(p), tuple(c), tuple(r)) for p, c, r in pairs]
    return collate_preference(samples, PAD)


@pytest.mark.parametrize("kind", ["sigmoid", "ipo"])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_dpo(kind, reduction):
    prompts = random_rows([3, 5, 2, 4], seed=12)
    chosen = random_rows([4, 6, 3, 2], seed=13)
    rejected = random_rows([5, 2, 7, 3], seed=14)
    pairs = list(zip(prompts, chosen, rejected))
    strategy = build(
        "dpo", tiny_policy(), reference=tiny_policy(seed=9), dpo_loss=kind, dpo_reduction=reduction
    )
    metrics = ("train/loss", "train/reward_accuracy", "train/reward_margin")
    assert_same_step(
        strategy, preference(pairs), [preference(pairs[:1]), preference(pairs[1:])], metrics
    )


def groups(rows, rewards, group_ids, prompt=3) -> TrajectoryBatch:
    lengths = [len(r) for r in rows]
    return TrajectoryBatch.from_tensors(
        pad_rows(rows, PAD),
        pad_rows([[1] * n for n in lengths]),
        pad_rows([[0] * prompt + [1] * (n - prompt) for n in lengths]).bool(),
        rewards=torch.tensor(rewards),
        group_ids=torch.tensor(group_ids),
    )


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_grpo(mode):
    rows = random_rows([7, 9, 6, 12, 10, 5, 8, 6], seed=15)
    rewards = [1.0, 0.0, 0.5, 0.2, 2.0, 0.0, 1.0, 1.5]
    group_ids = [0, 0, 1, 1, 2, 2, 3, 3]
    whole = groups(rows, rewards, group_ids)
    parts = [
        groups(rows[:4], rewards[:4], group_ids[:4]),
        groups(rows[4:], rewards[4:], group_ids[4:]),
    ]
    strategy = build(
        "grpo",
        tiny_policy(),
        reference=tiny_policy(seed=9),
        ppo_adv_estimator="grpo",
        ppo_kl_ctl=0.1,
        ppo_kl_estimator="k3",
        ppo_loss_agg_mode=mode,
    )
    metrics = (
        "train/loss",
        "loss/policy",
        "train/kl",
        "train/entropy",
        "train/advantage_mean",
        "train/reward_mean",
        "train/reward_std",
    )
    assert_same_step(strategy, whole, parts, metrics)

"""Offline ``grpo``: group advantages, the surrogate at ratio 1 and against behaviour
log-probs, the KL term, the synced old policy, the frozen reference, input validation."""

import math
from dataclasses import replace

import pytest
import torch
from strategy_testing import PAD, build, naive_logprobs, pad_rows, random_rows, tiny_policy

from ardea.data import TrajectoryBatch
from ardea.errors import ConfigError
from ardea.trainer.step.updates import read_metrics

EPS = 1e-8
REWARDS = [1.0, 0.0, 0.5, 0.5, 2.0, 0.0]
GROUPS = [0, 0, 1, 1, 2, 2]
LENGTHS = [7, 9, 6, 8, 10, 5]
PROMPT = 3  # every row: 3 prompt tokens, then its completion


def group_batch(rewards=REWARDS, groups=GROUPS, lengths=LENGTHS, seed=4) -> TrajectoryBatch:
    rows = random_rows(lengths, seed)
    return TrajectoryBatch.from_tensors(
        pad_rows(rows, PAD),
        pad_rows([[1] * n for n in lengths]),
        pad_rows([[0] * PROMPT + [1] * (n - PROMPT) for n in lengths]).bool(),
        rewards=torch.tensor(rewards),
        group_ids=torch.tensor(groups),
    )


def hand_advantages() -> list[float]:
    """GRPO by hand: (r - mean_g) / (std_g + 1e-8), population std."""
    return [
        (1.0 - 0.5) / (0.5 + EPS), (0.0 - 0.5) / (0.5 + EPS),  # group 0: mean 0.5, std 0.5
        0.0, 0.0,  # group 1: constant rewards
        (2.0 - 1.0) / (1.0 + EPS), (0.0 - 1.0) / (1.0 + EPS),  # group 2: mean 1, std 1
    ]  # fmt: skip


def step(strategy, batch):
    loss, metrics = strategy.loss(batch, strategy.step_counts([batch]))
    return loss, read_metrics(metrics)  # as the trainer reads them


def completion_tokens() -> list[int]:
    return [n - PROMPT for n in LENGTHS]


def test_ratio_one_surrogate_and_advantages():
    """Old policy == policy: loss = -sum_i A_i n_i / T, and its gradient is the naive
    policy gradient -sum_i A_i sum_t grad log pi / T."""
    policy = tiny_policy()
    strategy = build("grpo", policy, ppo_adv_estimator="grpo")
    loss, metrics = step(strategy, group_batch())
    adv, n = hand_advantages(), completion_tokens()
    tokens = sum(n)
    expected = -sum(a * k for a, k in zip(adv, n)) / tokens
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["loss/policy"] == pytest.approx(expected, abs=1e-6)
    assert metrics["train/advantage_mean"] == pytest.approx(-expected, abs=1e-6)
    assert metrics["loss/clip_frac"] == 0.0
    assert metrics["loss/approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["train/reward_mean"] == pytest.approx(sum(REWARDS) / 6)
    mean = sum(REWARDS) / 6
    std = math.sqrt(sum((r - mean) ** 2 for r in REWARDS) / 6)
    assert metrics["train/reward_std"] == pytest.approx(std)
    assert 0 < metrics["train/entropy"] <= math.log(len(policy.get_output_embeddings().weight))
    assert "train/kl" not in metrics  # kl_ctl = 0: no reference built
    loss.backward()
    got = {k: p.grad.clone() for k, p in policy.named_parameters()}
    policy.zero_grad(set_to_none=True)
    batch = group_batch()
    lp = naive_logprobs(policy, batch.input_ids, batch.attention_mask)  # (N, S-1)
    weights = torch.tensor(adv, dtype=torch.float64)[:, None] * batch.loss_mask[:, 1:]
    (-(weights * lp).sum() / tokens).backward()
    for name, param in policy.named_parameters():
        torch.testing.assert_close(got[name], param.grad, atol=1e-6, rtol=1e-5)


def test_null_estimator_means_grpo_gae_is_refused_and_dr_grpo_differs():
    policy = tiny_policy()
    default = step(build("grpo", policy), group_batch())[1]  # PPOConfig default: null
    with pytest.raises(ConfigError, match="needs a critic"):
        step(build("grpo", policy, ppo_adv_estimator="gae"), group_batch())
    grpo = step(build("grpo", policy, ppo_adv_estimator="grpo"), group_batch())[1]
    assert default["train/advantage_mean"] == pytest.approx(grpo["train/advantage_mean"])
    dr = step(build("grpo", policy, ppo_adv_estimator="dr_grpo"), group_batch())[1]
    centered = [0.5, -0.5, 0.0, 0.0, 1.0, -1.0]  # r - mean_g, no std division
    n = completion_tokens()
    expected = sum(a * k for a, k in zip(centered, n)) / sum(n)
    assert dr["train/advantage_mean"] == pytest.approx(expected, abs=1e-6)


def test_behaviour_logprobs_replace_the_old_policy():
    """Behaviour log-probs = policy log-probs + 0.5 on completions: r = exp(-0.5) < 1 - eps,
    so tokens with A < 0 are clipped at 0.8 and tokens with A > 0 keep r."""
    policy = tiny_policy()
    batch = group_batch()
    with torch.no_grad():
        lp = naive_logprobs(policy, batch.input_ids, batch.attention_mask).float()
    completion = batch.loss_mask
    behaviour = torch.zeros(completion.shape)
    behaviour[:, 1:] = lp  # token-aligned: behaviour[:, t] = log p(input_ids[:, t])
    batch = replace(batch, logprobs=(behaviour + 0.5) * completion)
    strategy = build("grpo", policy, ppo_adv_estimator="grpo", ppo_eps_clip=0.2)
    _, metrics = step(strategy, batch)
    adv, n = hand_advantages(), completion_tokens()
    r = math.exp(-0.5)
    per_row = [-a * (r if a > 0 else 0.8) for a in adv]
    tokens = sum(n)
    expected = sum(x * k for x, k in zip(per_row, n)) / tokens
    assert metrics["loss/policy"] == pytest.approx(expected, abs=1e-5)
    negative = sum(k for a, k in zip(adv, n) if a < 0)
    assert metrics["loss/clip_frac"] == pytest.approx(negative / tokens)
    assert metrics["loss/approx_kl"] == pytest.approx(r - 1 + 0.5, abs=1e-5)


def test_behaviour_logprobs_are_validated():
    batch = group_batch()
    with pytest.raises(
        ValueError, match=r"logprobs: must have shape \(N, S\) = \(6, 10\), got \(6, 9\)"
    ):
        replace(batch, logprobs=torch.zeros(6, 9))
    for bad in (float("nan"), -float("inf")):
        logprobs = torch.zeros(batch.loss_mask.shape)
        logprobs[2, 5] = bad
        with pytest.raises(
            ValueError, match=r"logprobs: must be finite on trained tokens \(row 2\)"
        ):
            replace(batch, logprobs=logprobs)


def test_offline_old_policy_is_the_policy_before_the_update():
    """An offline step is one optimizer update: without behaviour log-probs the ratio's
    old policy is the policy itself (detached), so the ratio is 1 on every token, nothing is
    clipped, and the gradient is that of -A * log pi (the ratio's gradient at 1)."""
    policy = tiny_policy()
    strategy = build("grpo", policy, ppo_adv_estimator="grpo")
    assert strategy.reference is None
    batch = group_batch()
    loss, metrics = step(strategy, batch)
    assert metrics["loss/approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["loss/clip_frac"] == 0.0
    loss.backward()
    grads = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()
    lp = naive_logprobs(policy, batch.input_ids, batch.attention_mask)  # (N, S-1)
    completion = batch.loss_mask[:, 1:].float()
    adv = torch.tensor(hand_advantages()).unsqueeze(-1)
    (-(adv * lp * completion).sum() / completion.sum()).backward()
    for got, expected in zip(grads, (p.grad for p in policy.parameters())):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_term_against_a_frozen_reference(estimator):
    policy, reference = tiny_policy(seed=0), tiny_policy(seed=5)
    kl_ctl = 0.1
    strategy = build(
        "grpo",
        policy,
        reference=reference,
        ppo_adv_estimator="grpo",
        ppo_kl_ctl=kl_ctl,
        ppo_kl_estimator=estimator,
    )
    assert strategy.reference is not None and not strategy.reference.model.training
    batch = group_batch()
    loss, metrics = step(strategy, batch)
    with torch.no_grad():
        log_ratio = naive_logprobs(policy, batch.input_ids, batch.attention_mask) - (
            naive_logprobs(reference, batch.input_ids, batch.attention_mask)
        )  # log(pi / pi_ref), (N, S-1)
    kl = log_ratio if estimator == "k1" else torch.exp(-log_ratio) + log_ratio - 1
    completion = batch.loss_mask[:, 1:]
    expected_kl = kl[completion].mean().item()
    assert metrics["train/kl"] == pytest.approx(expected_kl, abs=1e-5)
    assert loss.item() == pytest.approx(metrics["loss/policy"] + kl_ctl * expected_kl, abs=1e-5)
    before = {n: p.clone() for n, p in strategy.reference.model.named_parameters()}
    loss.backward()
    assert all(p.grad is None for p in strategy.reference.model.parameters())
    assert all(torch.equal(p, before[n]) for n, p in strategy.reference.model.named_parameters())


def test_kl_needs_a_reference_factory():
    from strategy_testing import TOKENIZER, make_config

    from ardea.errors import ConfigError
    from ardea.trainer.strategies import make_strategy

    config = make_config("grpo", ppo_kl_ctl=0.05)
    with pytest.raises(ConfigError, match="'grpo' needs a copy of the initial policy"):
        make_strategy("grpo", tiny_policy(), config, tokenizer=TOKENIZER)

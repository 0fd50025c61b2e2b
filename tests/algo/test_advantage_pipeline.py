"""compute_advantages: the seed's pipeline cases, alignment, shaping and bad input."""

import dataclasses
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ardea.algo.pipeline as pipeline
from ardea.algo import (
    AdvantageInputs,
    AdvantageOutputs,
    compute_advantages,
    compute_token_level_gae,
    next_token_align,
)
from ardea.config import PPOConfig

RELATIVE = "ardea.algo.lambda_fn.relative_position_gae_lambda"


def config(**overrides):
    """A duck-typed PPOConfig (lets tests pass values the dataclass would reject)."""
    return types.SimpleNamespace(**{**dataclasses.asdict(PPOConfig()), **overrides})


def batch(loss_mask, rewards=(1.0,), *, logprobs=None, attention_mask=None, turn_ids=None,
          ref_logp=None, values=None, group_ids=None, no_eos=None):  # fmt: skip
    """Rows written the way a trajectory batch stores them, token-aligned (column ``t``
    describes token ``t``; ``values`` already next-token aligned), converted to the
    next-token alignment :class:`AdvantageInputs` documents: ``out[:, t] = x[:, t + 1]``."""
    trained = torch.tensor(loss_mask, dtype=torch.bool)
    rows, width = trained.shape

    def shifted(x):
        return None if x is None else next_token_align(torch.where(trained, x, 0.0))

    if attention_mask is None:
        attention_mask = torch.ones(rows, width, dtype=torch.long)
    return AdvantageInputs(
        mask=next_token_align(trained, False),
        logprobs=shifted(torch.zeros(rows, width) if logprobs is None else logprobs),
        rewards=torch.tensor(rewards),
        lengths=attention_mask.long().sum(dim=-1),
        ref_logprobs=shifted(ref_logp),
        values=values,
        turn_ids=None if turn_ids is None else next_token_align(turn_ids, -1),
        group_ids=group_ids,
        no_eos=no_eos,
    )


def test_static_lambda_skips_the_dynamic_context(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a static lambda must not build the per-batch context")

    monkeypatch.setattr(pipeline, "build_lambda_context", fail)
    result = compute_advantages(batch([[0, 1, 1, 1]]), PPOConfig(gae_lambda=0.25))
    assert result.advantages.shape == (1, 4)


@pytest.mark.parametrize("gae_lambda", [float("nan"), float("inf")])
def test_static_lambda_must_be_finite(gae_lambda):
    with pytest.raises(ValueError, match="Static gae_lambda must be finite"):
        compute_advantages(batch([[0, 1, 1]]), config(gae_lambda=gae_lambda))
    with pytest.raises(ValueError, match="Static gae_lambda must be finite"):
        PPOConfig(gae_lambda=gae_lambda)


def test_relative_position_lambda_without_turn_ids():
    q, steps = 0.3, 10
    cfg = PPOConfig(gae_lambda=RELATIVE, gae_lambda_kwargs={"q": q})
    result = compute_advantages(batch([[0] + [1] * steps]), cfg)
    active = [q ** ((steps - s) / (steps - 1)) for s in range(1, steps + 1)]
    expected = torch.tensor([active + [0.0]])
    torch.testing.assert_close(result.advantages, expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(result.returns, expected, rtol=1e-6, atol=1e-7)


def test_turn_mode_keeps_kl_token_local_and_returns_task_only():
    data = batch(
        [[0, 1, 1, 1, 1]],
        rewards=(2.0,),
        turn_ids=torch.tensor([[-1, 0, 0, 1, 1]], dtype=torch.int32),
        logprobs=torch.tensor([[0.0, 0.0, 0.2, 0.4, 0.0]]),
        ref_logp=torch.zeros(1, 5),
    )
    result = compute_advantages(data, PPOConfig(gae_timestep_unit="turn", kl_ctl=1.0))
    torch.testing.assert_close(
        result.returns, torch.tensor([[2.0, 2.0, 2.0, 2.0, 0.0]]), rtol=0, atol=1e-6
    )
    torch.testing.assert_close(
        result.advantages, torch.tensor([[2.0, 1.8, 1.6, 2.0, 0.0]]), rtol=0, atol=1e-6
    )


def test_lambda_context_counts_shifted_trained_tokens_including_eos():
    captured = {}

    def capture(context):
        captured.update({k: v.clone() for k, v in context.items()})
        return torch.ones_like(context["timestep_lengths"], dtype=torch.float32)

    data = batch(
        [[0, 1, 1, 1, 0]],
        turn_ids=torch.tensor([[-1, 0, 0, 0, -1]], dtype=torch.int32),
        attention_mask=torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.bool),
    )
    compute_advantages(data, config(gae_lambda=capture))
    torch.testing.assert_close(
        captured["effective_token_lengths"], torch.tensor([3]), rtol=0, atol=0
    )
    torch.testing.assert_close(captured["turn_counts"], torch.tensor([1]), rtol=0, atol=0)


def test_custom_lambda_returning_a_scalar_is_rejected():
    with pytest.raises(ValueError, match="one value per local trajectory"):
        compute_advantages(
            batch([[0, 1, 1], [0, 1, 0]], rewards=(1.0, 0.0)),
            config(gae_lambda=lambda context: torch.tensor(0.5)),
        )


def test_turn_mode_requires_turn_ids():
    with pytest.raises(ValueError, match="requires rollout data.*turn_ids"):
        compute_advantages(batch([[0, 1, 1]]), PPOConfig(gae_timestep_unit="turn"))


def full_batch(prompt_len, values_resp, logprobs_resp, reward, ref_resp=None):
    """One trajectory: ``prompt_len`` prompt tokens then a complete response (EOS)."""
    resp = len(values_resp)
    total = prompt_len + resp
    values = torch.zeros(1, total)
    values[0, prompt_len - 1 : total - 1] = torch.tensor(
        values_resp
    )  # V before each response token
    logprobs = torch.zeros(1, total)
    logprobs[0, prompt_len:] = torch.tensor(logprobs_resp)
    ref = None
    if ref_resp is not None:
        ref = torch.zeros(1, total)
        ref[0, prompt_len:] = torch.tensor(ref_resp)
    return batch(
        [[0] * prompt_len + [1] * resp],
        rewards=(reward,),
        values=values,
        logprobs=logprobs,
        ref_logp=ref,
        no_eos=torch.tensor([False]),
    )


def test_matches_response_level_gae_with_terminal_reward():
    # seed 001: values (0.1, 0.2, 0.3), reward 2 at the last token, gamma 1, lambda 0.95
    cfg = PPOConfig(gae_lambda=0.95)
    result = compute_advantages(full_batch(4, [0.1, 0.2, 0.3], [0.0] * 3, 2.0), cfg)
    # by hand: deltas 0.2-0.1, 0.3-0.2, 2-0.3; A_t = delta_t + 0.95 A_(t+1); R = A + V
    exp_adv = torch.tensor([[0.1 + 0.95 * (0.1 + 0.95 * 1.7), 0.1 + 0.95 * 1.7, 1.7]])
    exp_ret = exp_adv + torch.tensor([[0.1, 0.2, 0.3]])
    torch.testing.assert_close(result.advantages[:, 3:6], exp_adv, rtol=0, atol=1e-6)
    torch.testing.assert_close(result.returns[:, 3:6], exp_ret, rtol=0, atol=1e-6)
    assert torch.count_nonzero(result.advantages[:, :3]) == 0


def test_kl_penalty_is_folded_into_token_rewards():
    # seed 001: behaviour logprobs exceed ref by 1 on each token, kl_ctl 0.01 -> -0.01 per token
    cfg = PPOConfig(gae_lambda=0.95, kl_ctl=0.01, kl_estimator="k1")
    result = compute_advantages(
        full_batch(4, [0.0, 0.0], [1.0, 1.0], 1.0, ref_resp=[0.0, 0.0]), cfg
    )
    # token rewards -0.01 and 1 - 0.01 with V = 0: A = (-0.01 + 0.95 * 0.99, 0.99)
    exp_adv = torch.tensor([[-0.01 + 0.95 * 0.99, 0.99]])
    torch.testing.assert_close(result.advantages[:, 3:5], exp_adv, rtol=0, atol=1e-6)


def test_padded_rows_get_zero_advantages_and_returns():
    data = batch(
        [[0, 1, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0]],
        rewards=(1.0, -1.0),
        attention_mask=torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], dtype=torch.bool),
        values=torch.rand(2, 6, generator=torch.Generator().manual_seed(0)),
    )
    result = compute_advantages(data, PPOConfig(gae_lambda=0.9, discount=0.9))
    trained = data.mask
    torch.testing.assert_close(
        trained, torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    )
    assert torch.count_nonzero(result.advantages[~trained]) == 0
    assert torch.count_nonzero(result.returns[~trained]) == 0
    assert torch.count_nonzero(result.advantages[trained]) == int(trained.sum())
    # the reward sits at each row's last trained position: with V = 0, lambda = 1 and
    # gamma = 0.5 the returns halve going back from it
    result = compute_advantages(data, PPOConfig(gae_lambda=1.0, discount=0.5))
    torch.testing.assert_close(
        result.returns[:, :4], torch.tensor([[0.125, 0.25, 0.5, 1.0], [-0.5, -1.0, 0, 0]])
    )


def test_outputs_are_typed_and_the_inputs_untouched():
    logprobs = torch.tensor([[0.0, -0.1, -0.2, -0.3]])
    data = batch([[0, 1, 1, 1]], logprobs=logprobs, turn_ids=torch.tensor([[-1, 0, 0, 1]]))
    before = {k: v.clone() for k, v in vars(data).items() if isinstance(v, torch.Tensor)}
    result = compute_advantages(data, PPOConfig())
    assert all(torch.equal(getattr(data, k), v) for k, v in before.items())
    torch.testing.assert_close(data.logprobs, torch.tensor([[-0.1, -0.2, -0.3, 0.0]]))
    assert isinstance(result, AdvantageOutputs)
    assert result.advantages.shape == result.returns.shape == (1, 4)


def test_bootstrap_reads_the_value_after_the_last_real_token():
    values = torch.tensor([[0.0, 0.0, 0.0, 5.0, 7.0]])  # 5.0 = V after token 3, 7.0 is padding
    data = batch(
        [[0, 1, 1, 1, 0]],
        rewards=(0.0,),
        values=values,
        no_eos=torch.tensor([True]),
        attention_mask=torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.bool),
    )
    result = compute_advantages(data, PPOConfig(gae_lambda=1.0, discount=1.0))
    torch.testing.assert_close(result.advantages, torch.tensor([[5.0, 5.0, 5.0, 0.0, 0.0]]))


def test_reward_bias_scaling_clip_and_no_eos_masking():
    data = batch(
        [[0, 1], [0, 1], [0, 1]],
        rewards=(1.0, 30.0, -1.0),
        no_eos=torch.tensor([False, False, True]),
    )
    result = compute_advantages(
        data, PPOConfig(reward_bias=1.0, reward_scaling=2.0, reward_clip=20.0)
    )
    # one trained position per row, V = 0: the return there is the shaped score itself
    torch.testing.assert_close(result.returns[:, 0], torch.tensor([4.0, 20.0, 0.0]))
    result = compute_advantages(data, PPOConfig(mask_no_eos_with_zero=True))
    torch.testing.assert_close(result.returns[:, 0], torch.tensor([1.0, 20.0, 0.0]))


def test_reward_and_advantage_normalization():
    rewards = (1.0, 3.0, 10.0, 20.0)
    data = batch([[0, 1]] * 4, rewards=rewards, group_ids=torch.tensor([0, 0, 1, 1]))
    group = compute_advantages(data, PPOConfig(reward_norm="group")).returns[:, 0]
    torch.testing.assert_close(group, torch.tensor([-1.0, 1.0, -1.0, 1.0]), rtol=0, atol=1e-6)
    whole = compute_advantages(data, PPOConfig(reward_norm="batch")).returns[:, 0]
    r = torch.tensor(rewards)
    torch.testing.assert_close(whole, (r - r.mean()) / (r.std(unbiased=False) + 1e-8))
    adv = compute_advantages(data, PPOConfig(adv_norm="batch")).advantages[:, 0]
    torch.testing.assert_close(adv, (r - r.mean()) / (r.std(unbiased=False) + 1e-8))
    with pytest.raises(ValueError, match="group_ids"):
        compute_advantages(batch([[0, 1]]), PPOConfig(adv_norm="group"))


def test_grpo_through_the_pipeline():
    data = batch(
        [[0, 1, 1], [0, 1, 0], [0, 1, 1]],
        rewards=(1.0, 0.0, 5.0),
        group_ids=torch.tensor([3, 3, 4]),
    )
    result = compute_advantages(data, PPOConfig(adv_estimator="grpo"))
    expected = (
        torch.tensor([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]) / (0.5 + 1e-8) * 0.5
    )
    torch.testing.assert_close(result.advantages, expected)


def fields(**changes):
    """A valid one-row AdvantageInputs's fields (3 columns, 2 trained), with ``changes``."""
    base = dict(
        mask=torch.tensor([[1, 1, 0]]),
        logprobs=torch.zeros(1, 3),
        rewards=torch.tensor([1.0]),
        lengths=torch.tensor([3]),
    )
    return {**base, **changes}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mask": torch.ones(3)}, r"AdvantageInputs.mask must have shape \(N, S\)"),
        ({"mask": torch.tensor([[1, 2, 0]])}, "only 0 and 1"),
        ({"logprobs": torch.zeros(1, 4)}, r"AdvantageInputs.logprobs must have shape"),
        ({"logprobs": torch.zeros(1, 3, dtype=torch.long)}, "floating-point"),
        ({"rewards": torch.tensor([1.0, 2.0])}, r"AdvantageInputs.rewards must have shape"),
        ({"logprobs": torch.tensor([[0.0, float("nan"), 0.0]])}, "finite"),
        ({"values": torch.full((1, 3), float("inf"))}, "finite"),
        ({"rewards": torch.tensor([float("nan")])}, "finite"),
        ({"lengths": torch.tensor([3.0])}, "AdvantageInputs.lengths must have an integer"),
        ({"turn_ids": torch.zeros(1, 3)}, "AdvantageInputs.turn_ids must have an integer"),
        ({"group_ids": torch.tensor([0, 1])}, r"AdvantageInputs.group_ids must have shape"),
        ({"no_eos": torch.tensor([True, False])}, r"AdvantageInputs.no_eos must have shape"),
    ],
)
def test_bad_inputs_are_named_when_built(changes, message):
    with pytest.raises((ValueError, TypeError), match=message):
        AdvantageInputs(**fields(**changes))


@pytest.mark.parametrize(
    ("changes", "cfg", "message"),
    [
        ({}, PPOConfig(kl_ctl=0.1), r"AdvantageInputs.ref_logprobs"),
        ({}, PPOConfig(adv_estimator="nope"), "unknown advantage estimator 'nope'"),
        (
            {"ref_logprobs": torch.zeros(1, 3)},
            config(kl_ctl=0.1, kl_estimator="k9"),
            "known estimators",
        ),  # fmt: skip
        ({}, PPOConfig(gae_timestep_unit="turn"), "requires rollout data.*turn_ids"),
        ({}, PPOConfig(adv_norm="group"), "group_ids"),
    ],
)
def test_bad_settings_are_named(changes, cfg, message):
    with pytest.raises(ValueError, match=message):
        compute_advantages(AdvantageInputs(**fields(**changes)), cfg)


def test_nan_logprobs_outside_trained_tokens_are_ignored():
    nan = float("nan")
    logprobs, reference = torch.tensor([[-0.5, -0.5, nan]]), torch.tensor([[0.0, 0.0, nan]])
    data = AdvantageInputs(**fields(logprobs=logprobs, ref_logprobs=reference))
    result = compute_advantages(data, PPOConfig(kl_ctl=0.1, kl_estimator="k1"))
    assert bool(torch.isfinite(result.advantages).all())


def seed_pipeline(data, gamma, lam):
    """The seed actor's recipe: roll by -1, reward at seqlen - 2, legacy recurrence, no KL."""
    mask = torch.roll(data["loss_mask"].float(), -1, dims=-1)
    seqlens = data["attention_mask"].sum(-1)
    no_eos = seqlens == mask.shape[1]
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(mask.shape[0]), (seqlens - 2).clamp(min=0)] += data["rewards"]
    adv, _ = compute_token_level_gae(
        rewards=rewards,
        values=data["values"],
        loss_mask=mask,
        seq_no_eos_mask=no_eos,
        bootstrap_values=data["values"][:, -1],
        discount=gamma,
        gae_lambda=lam,
        backend="torch",
    )
    return adv * mask


@settings(max_examples=60, deadline=None)
@given(
    layout=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 5)), min_size=1, max_size=4),
    gamma=st.floats(0, 1, width=32),
    lam=st.floats(0, 1, width=32),
    seed=st.integers(0, 2**16),
)
def test_agrees_with_the_seed_recipe_on_single_turn_rows(layout, gamma, lam, seed):
    width = max(p + r for p, r in layout)
    loss_mask = torch.zeros(len(layout), width)
    attention = torch.zeros(len(layout), width, dtype=torch.bool)
    for i, (p, r) in enumerate(layout):
        loss_mask[i, p : p + r] = 1
        attention[i, : p + r] = True
    gen = torch.Generator().manual_seed(seed)
    data = {
        "loss_mask": loss_mask,
        "attention_mask": attention,
        "logprobs": torch.zeros(len(layout), width),
        "rewards": torch.randn(len(layout), generator=gen),
        "values": torch.where(attention, torch.randn(len(layout), width, generator=gen), 0.0),
    }
    inputs = batch(
        loss_mask.tolist(),
        data["rewards"].tolist(),
        attention_mask=attention,
        values=data["values"],
    )
    result = compute_advantages(inputs, PPOConfig(discount=gamma, gae_lambda=lam, reward_clip=1e6))
    torch.testing.assert_close(result.advantages, seed_pipeline(data, gamma, lam), rtol=0, atol=0)

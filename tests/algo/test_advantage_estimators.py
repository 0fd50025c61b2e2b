"""Advantage estimators: registry, formulas, unequal groups."""

import pytest
import torch

from ardea.algo import (
    ADVANTAGE_ESTIMATORS,
    AdvantageOutputs,
    EstimatorInputs,
    get_advantage_estimator,
    group_stats,
    masked_whiten,
    register_advantage,
)

SCORES = torch.tensor([1.0, 0.0, 0.0, 3.0, 5.0, 2.0], dtype=torch.float64)
GROUPS = torch.tensor([7, 7, 7, 2, 2, 9])  # sizes 3, 2, 1; labels need not be dense
MASK = torch.tensor(
    [[0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 0], [0, 1, 0, 0]],
    dtype=torch.bool,
)


def make_inputs(scores=SCORES, groups=GROUPS, mask=MASK, **overrides):
    rows, cols = mask.shape
    zeros = torch.zeros(rows, cols, dtype=torch.float64)
    kwargs = dict(
        task_rewards=zeros.clone(),
        kl_rewards=zeros.clone(),
        scores=scores,
        loss_mask=mask,
        values=zeros.clone(),
        group_ids=groups,
        seq_no_eos_mask=torch.zeros(rows, dtype=torch.bool),
        bootstrap_values=torch.zeros(rows, dtype=torch.float64),
    )
    kwargs.update(overrides)
    return EstimatorInputs(**kwargs)


def per_trajectory(advantages, mask):
    """The single value each trajectory carries on its trained tokens (0 if none)."""
    return torch.where(mask, advantages, 0.0).sum(-1) / mask.sum(-1).clamp(min=1)


def test_registry_lists_the_six_estimators_with_one_signature():
    assert set(ADVANTAGE_ESTIMATORS) >= {
        "gae",
        "grpo",
        "dr_grpo",
        "rloo",
        "reinforce_pp",
        "reinforce_pp_baseline",
    }
    inputs = make_inputs()
    for name in ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"):
        out = get_advantage_estimator(name)(inputs)
        assert isinstance(out, AdvantageOutputs)
        assert out.advantages.shape == out.returns.shape == MASK.shape
        assert torch.count_nonzero(out.advantages[~MASK]) == 0
        assert torch.count_nonzero(out.returns[~MASK]) == 0


def test_unknown_estimator_lists_known_ones():
    with pytest.raises(
        ValueError, match=r"unknown advantage estimator 'ppo'; known estimators: dr_grpo, gae, grpo"
    ):
        get_advantage_estimator("ppo")


def test_dotted_path_and_registration():
    assert get_advantage_estimator(
        "ardea.algo.advantages.rloo_advantages"
    ) is ADVANTAGE_ESTIMATORS.get("rloo")

    @register_advantage("test_constant_one")
    def constant(inputs):
        ones = torch.where(inputs.loss_mask, 1.0, 0.0)
        return AdvantageOutputs(ones, ones)

    try:
        assert get_advantage_estimator("test_constant_one") is constant
        with pytest.raises(ValueError, match="already registered"):
            register_advantage("test_constant_one")(constant)
    finally:
        ADVANTAGE_ESTIMATORS.unregister("test_constant_one")


def test_grpo_normalizes_by_group_mean_and_population_std():
    out = get_advantage_estimator("grpo")(make_inputs())
    # group 7: (1, 0, 0), mean 1/3, std sqrt(2/9); group 2: (3, 5): mean 4, std 1; group 9: alone
    std7 = (2.0 / 9.0) ** 0.5
    expected = torch.tensor(
        [
            (2 / 3) / (std7 + 1e-8),
            (-1 / 3) / (std7 + 1e-8),
            (-1 / 3) / (std7 + 1e-8),
            -1 / (1 + 1e-8),
            1 / (1 + 1e-8),
            0.0,
        ],
        dtype=torch.float64,
    )
    got = per_trajectory(out.advantages, MASK)
    expected[3] = 0.0  # trajectory 3 has no trained token
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(
        out.advantages[4], torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64) / (1 + 1e-8)
    )


def test_grpo_matches_the_seed_formula_on_equal_groups():
    # seed 002: rewards (B, G); (r - mean) / (std(unbiased=False) + 1e-8)
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(3, 4, generator=gen)
    seed = (rewards - rewards.mean(-1, keepdim=True)) / (
        rewards.std(-1, keepdim=True, unbiased=False) + 1e-8
    )
    mask = torch.ones(12, 2, dtype=torch.bool)
    inputs = make_inputs(
        scores=rewards.flatten(),
        groups=torch.arange(3).repeat_interleave(4),
        mask=mask,
        task_rewards=torch.zeros(12, 2),
        kl_rewards=torch.zeros(12, 2),
        values=torch.zeros(12, 2),
    )
    out = get_advantage_estimator("grpo")(inputs)
    torch.testing.assert_close(out.advantages[:, 0], seed.flatten(), rtol=1e-5, atol=1e-6)


def test_dr_grpo_and_rloo():
    mean = torch.tensor([1 / 3, 1 / 3, 1 / 3, 4.0, 4.0, 2.0], dtype=torch.float64)
    dr = per_trajectory(get_advantage_estimator("dr_grpo")(make_inputs()).advantages, MASK)
    expected = (SCORES - mean) * MASK.any(-1)
    torch.testing.assert_close(dr, expected)
    rloo = per_trajectory(get_advantage_estimator("rloo")(make_inputs()).advantages, MASK)
    # leave-one-out: 1 - (0+0)/2, 0 - (1+0)/2, 0 - (1+0)/2, (3 - 5: no tokens), 5 - 3, alone -> 0
    torch.testing.assert_close(
        rloo, torch.tensor([1.0, -0.5, -0.5, 0.0, 2.0, 0.0], dtype=torch.float64)
    )


def test_kl_rewards_enter_the_trajectory_return():
    kl = torch.zeros(6, 4, dtype=torch.float64)
    kl[0, 1] = -0.5  # trajectory 0: R = 1 - 0.5
    out = get_advantage_estimator("dr_grpo")(make_inputs(kl_rewards=kl))
    assert float(per_trajectory(out.advantages, MASK)[0]) == pytest.approx(0.5 - 0.5 / 3)
    assert float(out.returns[0, 1]) == pytest.approx(0.5)


def test_group_estimators_need_group_ids():
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"):
        with pytest.raises(ValueError, match=f"'{name}' needs batch\\['group_ids'\\]"):
            get_advantage_estimator(name)(make_inputs(groups=None))


def test_reinforce_pp_whitens_discounted_token_returns():
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 0]], dtype=torch.bool)
    task = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 3.0, 0.0]], dtype=torch.float64)
    kl = torch.tensor([[-0.1, 0.0, 0.0, 0.0], [0.0, -0.2, 0.0, 0.0]], dtype=torch.float64)
    inputs = make_inputs(
        scores=torch.tensor([1.0, 3.0], dtype=torch.float64),
        groups=None,
        mask=mask,
        task_rewards=task,
        kl_rewards=kl,
        discount=0.5,
        values=torch.zeros(2, 4, dtype=torch.float64),
    )
    out = get_advantage_estimator("reinforce_pp")(inputs)
    returns = torch.tensor(
        [[-0.1 + 0.5 * 0.5, 0.5, 1.0, 0.0], [0.0, -0.2 + 1.5, 3.0, 0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(out.returns, returns)
    values = returns[mask]
    expected = torch.zeros_like(returns)
    expected[mask] = (values - values.mean()) / (values.std(unbiased=False) + 1e-8)
    torch.testing.assert_close(out.advantages, expected)


def test_reinforce_pp_baseline_centers_per_group_then_whitens_over_the_batch():
    out = get_advantage_estimator("reinforce_pp_baseline")(make_inputs())
    mean = torch.tensor([1 / 3, 1 / 3, 1 / 3, 4.0, 4.0, 2.0], dtype=torch.float64)
    centered = torch.where(MASK, (SCORES - mean)[:, None], 0.0)
    torch.testing.assert_close(out.advantages, masked_whiten(centered, MASK))
    tokens = out.advantages[MASK]
    assert abs(float(tokens.mean())) < 1e-9
    assert float(tokens.std(unbiased=False)) == pytest.approx(1.0, abs=1e-6)


def test_gae_turn_unit_keeps_kl_token_local():
    mask = torch.tensor([[1, 1, 1, 1]], dtype=torch.bool)
    task = torch.tensor([[0.0, 0.0, 0.0, 2.0]], dtype=torch.float64)
    kl = torch.tensor([[0.0, -0.2, -0.4, 0.0]], dtype=torch.float64)
    inputs = make_inputs(
        scores=torch.tensor([2.0], dtype=torch.float64),
        groups=None,
        mask=mask,
        task_rewards=task,
        kl_rewards=kl,
        values=torch.zeros(1, 4, dtype=torch.float64),
        timestep_unit="turn",
        turn_ids=torch.tensor([[0, 0, 1, 1]]),
    )
    out = get_advantage_estimator("gae")(inputs)
    torch.testing.assert_close(
        out.advantages, torch.tensor([[2.0, 1.8, 1.6, 2.0]], dtype=torch.float64)
    )
    torch.testing.assert_close(
        out.returns, torch.tensor([[2.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
    )
    with pytest.raises(ValueError, match="turn_ids"):
        get_advantage_estimator("gae")(make_inputs(timestep_unit="turn"))
    with pytest.raises(ValueError, match="gae_timestep_unit"):
        get_advantage_estimator("gae")(make_inputs(timestep_unit="episode"))


def test_group_stats_handles_unequal_groups():
    mean, std, size = group_stats(SCORES, GROUPS)
    torch.testing.assert_close(size, torch.tensor([3.0, 3, 3, 2, 2, 1], dtype=torch.float64))
    torch.testing.assert_close(
        mean, torch.tensor([1 / 3, 1 / 3, 1 / 3, 4, 4, 2], dtype=torch.float64)
    )
    torch.testing.assert_close(std[3:], torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))


def test_process_rewards_stay_with_their_tokens_in_group_estimators():
    """GRPO: A_t = (R - mean_g) / (std_g + eps) + p_t, the process reward not rescaled."""
    process = torch.zeros(6, 4, dtype=torch.float64)
    process[0, 1], process[0, 2], process[2, 3] = -0.3, 0.2, 5.0
    process[3, 0] = 7.0  # an untrained position: ignored
    plain = get_advantage_estimator("grpo")(make_inputs())
    out = get_advantage_estimator("grpo")(make_inputs(process_rewards=process))
    torch.testing.assert_close(out.advantages, plain.advantages + torch.where(MASK, process, 0.0))
    torch.testing.assert_close(out.returns, plain.returns)  # the outcome returns unchanged
    assert float(out.advantages[3, 0]) == 0.0


def test_process_rewards_reach_token_level_gae_as_rewards():
    """One row, gamma 1, lambda 1, V = 0: A_t = sum of rewards from t on, process included
    (the last column is GAE's bootstrap slot)."""
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    task = torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    process = torch.tensor([[0.5, -0.25, 0.125, 0.0]], dtype=torch.float64)
    inputs = make_inputs(
        scores=torch.tensor([1.0], dtype=torch.float64),
        groups=None,
        mask=mask,
        task_rewards=task,
        kl_rewards=torch.zeros(1, 4, dtype=torch.float64),
        values=torch.zeros(1, 4, dtype=torch.float64),
        bootstrap_values=torch.zeros(1, dtype=torch.float64),
        seq_no_eos_mask=torch.zeros(1, dtype=torch.bool),
        process_rewards=process,
    )
    out = get_advantage_estimator("gae")(inputs)
    expected = torch.tensor([[1.375, 0.875, 1.125, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(out.advantages, expected)
    torch.testing.assert_close(out.returns, expected)  # V = 0

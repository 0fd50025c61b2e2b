"""Response-layout GAE ``(..., R)``: the seed's cases and a property test."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ardea.algo import compute_gae


def test_monte_carlo_return_when_values_are_zero(backend):
    rewards = torch.zeros(2, 3, 4)
    rewards[..., -1] = 1.0
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    adv, ret = compute_gae(rewards, torch.zeros_like(rewards), mask, 1.0, 1.0, backend=backend)
    assert adv.shape == ret.shape == (2, 3, 4)
    torch.testing.assert_close(adv, torch.ones(2, 3, 4))
    torch.testing.assert_close(ret, torch.ones(2, 3, 4))


def test_lambda_zero_is_the_one_step_td_error(backend):
    rewards = torch.tensor([[[0.0, 0.0, 2.0]]])
    values = torch.tensor([[[0.5, 1.0, -0.5]]])
    adv, ret = compute_gae(rewards, values, torch.ones(1, 1, 3), 0.9, 0.0, backend=backend)
    # delta_2 = 2 + 0 + 0.5; delta_1 = 0.9 * -0.5 - 1; delta_0 = 0.9 * 1 - 0.5
    torch.testing.assert_close(adv, torch.tensor([[[0.4, -1.45, 2.5]]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(ret, adv + values, rtol=0, atol=1e-6)


def test_hand_computed_discounted_case(backend):
    gamma, lam = 0.9, 0.8
    adv, ret = compute_gae(
        torch.tensor([[[0.0, 0.0, 1.0]]]),
        torch.tensor([[[0.1, 0.2, 0.3]]]),
        torch.ones(1, 1, 3),
        gamma,
        lam,
        backend=backend,
    )
    a2 = 1.0 - 0.3
    a1 = gamma * 0.3 - 0.2 + gamma * lam * a2
    a0 = gamma * 0.2 - 0.1 + gamma * lam * a1
    torch.testing.assert_close(adv, torch.tensor([[[a0, a1, a2]]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(
        ret, torch.tensor([[[a0 + 0.1, a1 + 0.2, a2 + 0.3]]]), rtol=0, atol=1e-6
    )


def test_padding_does_not_leak(backend):
    gen = torch.Generator().manual_seed(1)
    rewards = torch.zeros(2, 2, 5)
    rewards[0, 0, 2] = 1.0
    values = torch.randn(2, 2, 5, generator=gen)
    mask = torch.ones(2, 2, 5, dtype=torch.bool)
    mask[0, 0, 3:] = False
    mask[1, :, 2:] = False
    rewards[0, 0, 3:] = 100.0  # garbage in padding
    adv, ret = compute_gae(rewards, values, mask, 0.9, 0.9, backend=backend)
    assert torch.count_nonzero(adv[~mask]) == 0
    assert torch.count_nonzero(ret[~mask]) == 0
    assert adv[0, 0, 2] != 0.0
    clean, _ = compute_gae(
        torch.where(mask, rewards, 0.0), torch.where(mask, values, 0.0), mask, 0.9, 0.9
    )
    torch.testing.assert_close(adv, clean, rtol=0, atol=0)


def test_empty_response_is_all_zero(backend):
    values = torch.randn(1, 1, 3, generator=torch.Generator().manual_seed(0))
    adv, ret = compute_gae(
        torch.zeros(1, 1, 3),
        values,
        torch.zeros(1, 1, 3, dtype=torch.bool),
        1.0,
        0.95,
        backend=backend,
    )
    assert torch.count_nonzero(adv) == 0
    assert torch.count_nonzero(ret) == 0


def test_lambda_per_trajectory_has_the_leading_shape():
    rewards = torch.tensor([[[0.0, 1.0], [0.0, 1.0]]])  # (B=1, G=2, R=2)
    adv, _ = compute_gae(
        rewards, torch.zeros_like(rewards), torch.ones(1, 2, 2), 1.0, torch.tensor([[0.5, 0.0]])
    )
    torch.testing.assert_close(adv, torch.tensor([[[0.5, 1.0], [0.0, 1.0]]]))
    with pytest.raises(ValueError, match="gae_lambda"):
        compute_gae(
            rewards, torch.zeros_like(rewards), torch.ones(1, 2, 2), 1.0, torch.tensor([0.5])
        )


def seed_response_gae(rewards, values, mask, gamma, lam):
    """The seed's right-padded formula, written as a loop over a flat (M, R) batch."""
    values = values * mask
    adv = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        nxt = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros(rewards.shape[0])
        delta = rewards[:, t] + gamma * nxt - values[:, t]
        running = mask[:, t] * (delta + gamma * lam * running)
        adv[:, t] = running
    return adv, adv + values


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 8), min_size=1, max_size=5),
    gamma=st.floats(0, 1, width=32),
    lam=st.floats(0, 1, width=32),
    seed=st.integers(0, 2**16),
)
def test_right_padded_masks_match_the_seed_formula_bit_exactly(lengths, gamma, lam, seed):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(len(lengths), 8, generator=gen)
    values = torch.randn(len(lengths), 8, generator=gen)
    mask = (torch.arange(8) < torch.tensor(lengths)[:, None]).float()
    exp_adv, exp_ret = seed_response_gae(rewards, values, mask, gamma, lam)
    adv, ret = compute_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv, exp_adv, rtol=0, atol=0)
    torch.testing.assert_close(ret, exp_ret, rtol=0, atol=0)


def naive_response_gae(rewards, values, mask, gamma, lam):
    """Per-response reference: recurse over valid positions only, terminal value 0."""
    adv_out, ret_out = [], []
    for r, v, m in zip(rewards, values, mask):
        adv, nxt = 0.0, 0.0
        row_adv, row_ret = [0.0] * len(r), [0.0] * len(r)
        for t in reversed([t for t, ok in enumerate(m) if ok]):
            adv = r[t] + gamma * nxt - v[t] + gamma * lam * adv
            row_adv[t], row_ret[t], nxt = adv, adv + v[t], v[t]
        adv_out.append(row_adv)
        ret_out.append(row_ret)
    return adv_out, ret_out


@settings(max_examples=100, deadline=None)
@given(
    mask=st.lists(st.lists(st.booleans(), min_size=6, max_size=6), min_size=1, max_size=4),
    gamma=st.floats(0, 1),
    lam=st.floats(0, 1),
    seed=st.integers(0, 2**16),
)
def test_any_mask_matches_naive_reference(mask, gamma, lam, seed):
    gen = torch.Generator().manual_seed(seed)
    rows = len(mask)
    rewards = torch.randn(rows, 6, generator=gen, dtype=torch.float64)
    values = torch.randn(rows, 6, generator=gen, dtype=torch.float64)
    exp_adv, exp_ret = naive_response_gae(rewards.tolist(), values.tolist(), mask, gamma, lam)
    adv, ret = compute_gae(rewards, values, torch.tensor(mask), gamma, lam)
    torch.testing.assert_close(
        adv, torch.tensor(exp_adv, dtype=torch.float64), rtol=1e-12, atol=1e-12
    )
    torch.testing.assert_close(
        ret, torch.tensor(exp_ret, dtype=torch.float64), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (
            (torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3)),
            ValueError,
            "values must have shape",
        ),
        (
            (torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(3, 3)),
            ValueError,
            "mask must have shape",
        ),
        (
            (torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3), torch.ones(2, 3)),
            TypeError,
            "rewards",
        ),
        (
            (torch.full((2, 3), float("nan")), torch.zeros(2, 3), torch.ones(2, 3)),
            ValueError,
            "finite",
        ),
    ],
)
def test_bad_input_is_named(args, error, message):
    with pytest.raises(error, match=message):
        compute_gae(*args, 1.0, 1.0)

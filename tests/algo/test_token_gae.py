"""Token-level GAE: the seed's legacy recurrence, per-trajectory lambda, property tests."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ardea.algo import compute_token_level_gae


def legacy_recurrence(rewards, values, loss_mask, no_eos, bootstrap, discount, gae_lambda):
    """The seed's column loop, in its op order (the bit-exact reference)."""
    last = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    next_values = bootstrap * no_eos
    columns = [last]
    for t in reversed(range(rewards.shape[1] - 1)):
        delta = rewards[:, t] + discount * next_values - values[:, t]
        candidate = delta + discount * gae_lambda * last
        keep = loss_mask[:, t]
        next_values = next_values * (1 - keep) + values[:, t] * keep
        last = last * (1 - keep) + candidate * keep
        columns.append(last)
    return torch.stack(columns[::-1], dim=1)


def naive_token_gae(rewards, values, mask, no_eos, bootstrap, discount, lambdas):
    """Per-trajectory pure-Python GAE over trained tokens; column T-1 is the bootstrap slot."""
    out = []
    for b, row in enumerate(rewards):
        adv, nxt = 0.0, (bootstrap[b] if no_eos[b] else 0.0)
        row_out = [0.0] * len(row)
        for t in range(len(row) - 2, -1, -1):
            if mask[b][t]:
                adv = row[t] + discount * nxt - values[b][t] + discount * lambdas[b] * adv
                nxt = values[b][t]
            row_out[t] = adv
        out.append(row_out)
    return out


def test_matches_legacy_recurrence_bit_exactly(backend):
    # seed 000: rewards, values, masks, gamma=0.9, lambda=0.8, rtol=0, atol=0
    rewards = torch.tensor([[0.0, 0.5, 0.0, 2.0], [0.0, 1.0, 0.0, 0.0]])
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.2, 0.1, 0.0, 0.5]])
    loss_mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    no_eos = torch.tensor([False, True])
    expected = legacy_recurrence(rewards, values, loss_mask, no_eos, values[:, -1], 0.9, 0.8)
    adv, ret = compute_token_level_gae(
        rewards=rewards,
        values=values,
        loss_mask=loss_mask,
        seq_no_eos_mask=no_eos,
        bootstrap_values=values[:, -1],
        discount=0.9,
        gae_lambda=0.8,
        backend=backend,
    )
    assert adv.shape == ret.shape == (2, 4)
    torch.testing.assert_close(adv, expected, rtol=0, atol=0)
    torch.testing.assert_close(ret, expected + values, rtol=0, atol=0)


def test_one_lambda_per_trajectory(backend):
    # seed 000: lambda (0.5, 0.0) decays the terminal reward only in the first row
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    loss_mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    adv, _ = compute_token_level_gae(
        rewards=rewards,
        values=torch.zeros_like(rewards),
        loss_mask=loss_mask,
        seq_no_eos_mask=torch.tensor([False, False]),
        bootstrap_values=torch.zeros(2),
        discount=1.0,
        gae_lambda=torch.tensor([0.5, 0.0]),
        backend=backend,
    )
    expected = torch.tensor([[0.25, 0.5, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    torch.testing.assert_close(adv, expected, rtol=0, atol=0)


def test_tool_output_gap_costs_no_discount(backend):
    # a reward after a masked gap reaches the earlier token with one factor gamma*lambda
    rewards = torch.tensor([[0.0, 5.0, 5.0, 1.0, 0.0]])
    adv, _ = compute_token_level_gae(
        rewards=rewards,
        values=torch.zeros_like(rewards),
        loss_mask=torch.tensor([[1, 0, 0, 1, 0]]),
        seq_no_eos_mask=torch.tensor([False]),
        bootstrap_values=torch.zeros(1),
        discount=0.5,
        gae_lambda=1.0,
        backend=backend,
    )
    torch.testing.assert_close(adv, torch.tensor([[0.5, 1.0, 1.0, 1.0, 0.0]]), rtol=0, atol=0)


def test_bootstrap_only_for_truncated_rows(backend):
    values = torch.tensor([[0.0, 0.0, 4.0], [0.0, 0.0, 4.0]])
    adv, ret = compute_token_level_gae(
        rewards=torch.zeros(2, 3),
        values=values,
        loss_mask=torch.tensor([[1, 1, 0], [1, 1, 0]]),
        seq_no_eos_mask=torch.tensor([True, False]),
        bootstrap_values=values[:, -1],
        discount=0.5,
        gae_lambda=0.5,
        backend=backend,
    )
    # row 0: delta_1 = 0.5 * 4 = 2, A_0 = 0 + 0.25 * 2; row 1 ends: all zero
    torch.testing.assert_close(adv, torch.tensor([[0.5, 2.0, 0.0], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(ret, adv + values, rtol=0, atol=0)


@st.composite
def token_batches(draw, dtype=torch.float64):
    rows = draw(st.integers(1, 4))
    cols = draw(st.integers(1, 12))
    floats = st.floats(-10, 10, allow_nan=False, width=32)
    grid = st.lists(st.lists(floats, min_size=cols, max_size=cols), min_size=rows, max_size=rows)
    mask = draw(
        st.lists(
            st.lists(st.booleans(), min_size=cols, max_size=cols), min_size=rows, max_size=rows
        )
    )
    per_row = draw(st.booleans())
    lam = draw(st.lists(st.floats(0, 1, width=32), min_size=rows, max_size=rows))
    return dict(
        rewards=torch.tensor(draw(grid), dtype=dtype),
        values=torch.tensor(draw(grid), dtype=dtype),
        loss_mask=torch.tensor(mask),
        seq_no_eos_mask=torch.tensor(draw(st.lists(st.booleans(), min_size=rows, max_size=rows))),
        bootstrap_values=torch.tensor(
            draw(st.lists(floats, min_size=rows, max_size=rows)), dtype=dtype
        ),
        discount=draw(st.floats(0, 1, width=32)),
        gae_lambda=torch.tensor(lam, dtype=dtype) if per_row else lam[0],
    )


@settings(max_examples=150, deadline=None)
@given(batch=token_batches())
def test_matches_naive_per_sample_reference(batch):
    lam = batch["gae_lambda"]
    lambdas = lam.tolist() if isinstance(lam, torch.Tensor) else [lam] * batch["rewards"].shape[0]
    expected = naive_token_gae(
        batch["rewards"].tolist(),
        batch["values"].tolist(),
        batch["loss_mask"].tolist(),
        batch["seq_no_eos_mask"].tolist(),
        batch["bootstrap_values"].tolist(),
        batch["discount"],
        lambdas,
    )
    for backend in ("auto", "torch"):
        adv, ret = compute_token_level_gae(**batch, backend=backend)
        torch.testing.assert_close(
            adv, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12
        )
        torch.testing.assert_close(ret, adv + batch["values"], rtol=0, atol=0)


@settings(max_examples=150, deadline=None)
@given(batch=token_batches(dtype=torch.float32))
def test_float32_is_bit_exact_with_legacy_loop(batch):
    expected = legacy_recurrence(
        batch["rewards"],
        batch["values"],
        batch["loss_mask"].float(),
        batch["seq_no_eos_mask"],
        batch["bootstrap_values"],
        batch["discount"],
        batch["gae_lambda"],
    )
    for backend in ("auto", "torch"):
        adv, _ = compute_token_level_gae(**batch, backend=backend)
        torch.testing.assert_close(adv, expected, rtol=0, atol=0)


def _call(**overrides):
    kwargs = dict(
        rewards=torch.zeros(2, 3),
        values=torch.zeros(2, 3),
        loss_mask=torch.ones(2, 3),
        seq_no_eos_mask=torch.zeros(2, dtype=torch.bool),
        bootstrap_values=torch.zeros(2),
        discount=1.0,
        gae_lambda=0.9,
    )
    kwargs.update(overrides)
    return compute_token_level_gae(**kwargs)


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"values": torch.zeros(2, 4)}, ValueError, r"values must have shape \(B, T\)"),
        ({"rewards": torch.zeros(2, 3, dtype=torch.long)}, TypeError, "floating-point"),
        ({"values": torch.zeros(2, 3, dtype=torch.float64)}, TypeError, "dtype"),
        ({"rewards": torch.tensor([[0.0, float("nan"), 0.0]] * 2)}, ValueError, "finite"),
        ({"values": torch.tensor([[0.0, float("inf"), 0.0]] * 2)}, ValueError, "finite"),
        ({"loss_mask": torch.full((2, 3), 0.5)}, ValueError, "only 0 and 1"),
        ({"seq_no_eos_mask": torch.zeros(3, dtype=torch.bool)}, ValueError, "seq_no_eos_mask"),
        ({"bootstrap_values": torch.zeros(3)}, ValueError, "bootstrap_values"),
        ({"gae_lambda": 1.5}, ValueError, r"gae_lambda must lie in \[0, 1\]"),
        ({"gae_lambda": float("nan")}, ValueError, "finite"),
        ({"gae_lambda": torch.tensor([0.5, 0.5, 0.5])}, ValueError, "gae_lambda"),
        ({"gae_lambda": torch.tensor([0.5, 2.0])}, ValueError, r"\[0, 1\]"),
        ({"discount": -0.1}, ValueError, "discount"),
        ({"discount": True}, TypeError, "discount"),
    ],
)
def test_bad_input_is_named(overrides, error, message):
    with pytest.raises(error, match=message):
        _call(**overrides)


def test_empty_and_single_column_batches():
    adv, ret = _call(
        rewards=torch.zeros(2, 0), values=torch.zeros(2, 0), loss_mask=torch.ones(2, 0)
    )
    assert adv.shape == ret.shape == (2, 0)
    adv, _ = _call(rewards=torch.ones(2, 1), values=torch.zeros(2, 1), loss_mask=torch.ones(2, 1))
    torch.testing.assert_close(adv, torch.zeros(2, 1))  # the only column is the bootstrap slot

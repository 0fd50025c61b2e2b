"""Turn-level GAE: the seed's cases, validation of turn_ids, property test."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ardea.algo import compute_turn_level_gae


def test_steps_once_per_turn_and_broadcasts(backend):
    # seed 000: lambda decays between turns, not between the tokens of a turn
    rewards = torch.tensor([[0.0, 1.0, 0.0, 2.0]])
    adv, ret = compute_turn_level_gae(
        rewards=rewards,
        values=torch.zeros_like(rewards),
        loss_mask=torch.ones_like(rewards),
        turn_ids=torch.tensor([[0, 0, 1, 1]], dtype=torch.int32),
        seq_no_eos_mask=torch.tensor([False]),
        bootstrap_values=torch.zeros(1),
        discount=1.0,
        gae_lambda=0.5,
        backend=backend,
    )
    expected = torch.tensor([[2.0, 2.0, 2.0, 2.0]])  # turn 1: 2; turn 0: 1 + 0.5 * 2
    torch.testing.assert_close(adv, expected, rtol=0, atol=0)
    torch.testing.assert_close(ret, expected, rtol=0, atol=0)


def test_gaps_and_unused_ids_cost_no_step_first_value_and_bootstrap(backend):
    # seed 000: turns 0 and 2 (id 1 unused), a prompt gap, bootstrap from the last value
    rewards = torch.tensor([[0.0, 3.0, 0.0, 0.0, 4.0]])
    values = torch.tensor([[1.0, 5.0, 9.0, 2.0, 8.0]])
    adv, ret = compute_turn_level_gae(
        rewards=rewards,
        values=values,
        loss_mask=torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0]]),
        turn_ids=torch.tensor([[0, 0, -1, 2, 2]]),
        seq_no_eos_mask=torch.tensor([True]),
        bootstrap_values=values[:, -1],
        discount=0.5,
        gae_lambda=0.25,
        backend=backend,
    )
    # turn 2: 4 + 0.5 * 8 - 2 = 6; turn 0: (3 + 0.5 * 2 - 1) + 0.125 * 6 = 3.75
    torch.testing.assert_close(adv, torch.tensor([[3.75, 3.75, 0.0, 6.0, 6.0]]), rtol=0, atol=0)
    torch.testing.assert_close(ret, torch.tensor([[4.75, 4.75, 9.0, 8.0, 8.0]]), rtol=0, atol=0)


def test_one_lambda_per_trajectory(backend):
    rewards = torch.tensor([[0.0, 1.0, 0.0, 2.0], [0.0, 1.0, 0.0, 2.0]])
    adv, _ = compute_turn_level_gae(
        rewards=rewards,
        values=torch.zeros_like(rewards),
        loss_mask=torch.ones_like(rewards),
        turn_ids=torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1]], dtype=torch.int32),
        seq_no_eos_mask=torch.tensor([False, False]),
        bootstrap_values=torch.zeros(2),
        discount=1.0,
        gae_lambda=torch.tensor([0.5, 0.0]),
        backend=backend,
    )
    expected = torch.tensor([[2.0, 2.0, 2.0, 2.0], [1.0, 1.0, 2.0, 2.0]])
    torch.testing.assert_close(adv, expected, rtol=0, atol=0)


def _call(turn_ids, rewards=None, backend="auto"):
    rewards = torch.zeros(1, 4) if rewards is None else rewards
    return compute_turn_level_gae(
        rewards=rewards,
        values=torch.zeros_like(rewards),
        loss_mask=torch.ones_like(rewards),
        turn_ids=turn_ids,
        seq_no_eos_mask=torch.tensor([False]),
        bootstrap_values=torch.zeros(1),
        discount=1.0,
        gae_lambda=1.0,
        backend=backend,
    )


@pytest.mark.parametrize(
    ("turn_ids", "message"),
    [
        ([-1, 0, 0, 1], "non-negative"),
        ([0, 0, 4, 4], "smaller than the sequence length"),
        ([0, 1, 0, 2], "temporally nondecreasing"),
    ],
)
def test_rejects_malformed_active_turn_ids(turn_ids, message, backend):
    with pytest.raises(RuntimeError, match=message):
        _call(torch.tensor([turn_ids]), backend=backend)


def test_rejects_non_integer_turn_ids(backend):
    with pytest.raises(ValueError, match="integer dtype"):
        _call(torch.tensor([[0.0, 0.0]]), rewards=torch.zeros(1, 2), backend=backend)
    with pytest.raises(ValueError, match="turn_ids must have shape"):
        _call(torch.zeros(1, 3, dtype=torch.long), backend=backend)


def test_ids_at_untrained_positions_are_not_checked(backend):
    rewards = torch.tensor([[1.0, 0.0, 1.0]])
    adv, _ = compute_turn_level_gae(
        rewards=rewards,
        values=torch.zeros_like(rewards),
        loss_mask=torch.tensor([[1, 0, 1]]),
        turn_ids=torch.tensor([[0, 99, 1]]),
        seq_no_eos_mask=torch.tensor([False]),
        bootstrap_values=torch.zeros(1),
        discount=1.0,
        gae_lambda=1.0,
        backend=backend,
    )
    torch.testing.assert_close(adv, torch.tensor([[2.0, 0.0, 1.0]]))


def naive_turn_gae(rewards, values, mask, turn_ids, no_eos, bootstrap, discount, lambdas):
    """Per-trajectory reference: collect turns in time order, recurse over them, broadcast."""
    advs, rets = [], []
    for b in range(len(rewards)):
        turns = {}  # id -> [reward sum, value at first token]
        for t, active in enumerate(mask[b]):
            if active:
                turn = turns.setdefault(turn_ids[b][t], [0.0, values[b][t]])
                turn[0] += rewards[b][t]
        adv_of, ret_of = {}, {}
        adv, nxt = 0.0, (bootstrap[b] if no_eos[b] else 0.0)
        for turn_id in sorted(turns, reverse=True):
            reward, value = turns[turn_id]
            adv = reward + discount * nxt - value + discount * lambdas[b] * adv
            adv_of[turn_id], ret_of[turn_id], nxt = adv, adv + value, value
        advs.append([adv_of[i] if m else 0.0 for i, m in zip(turn_ids[b], mask[b])])
        rets.append([ret_of[i] if m else v for i, m, v in zip(turn_ids[b], mask[b], values[b])])
    return advs, rets


@st.composite
def turn_layouts(draw):
    rows, cols = draw(st.integers(1, 4)), draw(st.integers(1, 12))
    floats = st.floats(-10, 10, allow_nan=False, width=32)
    masks, ids = [], []
    for _ in range(rows):
        current, row_mask, row_ids = 0, [], []
        for _ in range(cols):
            active = draw(st.booleans())
            current += draw(st.sampled_from([0, 0, 1, 2]))  # stay, next turn or skip an id
            row_mask.append(active and current < cols)
            row_ids.append(current if row_mask[-1] else -1)
        masks.append(row_mask)
        ids.append(row_ids)
    lam = draw(st.lists(st.floats(0, 1, width=32), min_size=rows, max_size=rows))
    per_row = draw(st.booleans())
    grid = st.lists(st.lists(floats, min_size=cols, max_size=cols), min_size=rows, max_size=rows)
    return dict(
        rewards=torch.tensor(draw(grid), dtype=torch.float64),
        values=torch.tensor(draw(grid), dtype=torch.float64),
        loss_mask=torch.tensor(masks),
        turn_ids=torch.tensor(ids),
        seq_no_eos_mask=torch.tensor(draw(st.lists(st.booleans(), min_size=rows, max_size=rows))),
        bootstrap_values=torch.tensor(
            draw(st.lists(floats, min_size=rows, max_size=rows)), dtype=torch.float64
        ),
        discount=draw(st.floats(0, 1, width=32)),
        gae_lambda=torch.tensor(lam, dtype=torch.float64) if per_row else lam[0],
    )


@settings(max_examples=150, deadline=None)
@given(batch=turn_layouts())
def test_matches_naive_per_sample_reference(batch):
    lam = batch["gae_lambda"]
    rows = batch["rewards"].shape[0]
    lambdas = lam.tolist() if isinstance(lam, torch.Tensor) else [lam] * rows
    exp_adv, exp_ret = naive_turn_gae(
        batch["rewards"].tolist(),
        batch["values"].tolist(),
        batch["loss_mask"].tolist(),
        batch["turn_ids"].tolist(),
        batch["seq_no_eos_mask"].tolist(),
        batch["bootstrap_values"].tolist(),
        batch["discount"],
        lambdas,
    )
    for backend in ("auto", "torch"):
        adv, ret = compute_turn_level_gae(**batch, backend=backend)
        torch.testing.assert_close(
            adv, torch.tensor(exp_adv, dtype=torch.float64), rtol=1e-9, atol=1e-9
        )
        torch.testing.assert_close(
            ret, torch.tensor(exp_ret, dtype=torch.float64), rtol=1e-9, atol=1e-9
        )

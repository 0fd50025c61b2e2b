"""GAE lambda functions, their resolution from a config value, and the length context."""

import pytest
import torch

from ardea.algo import (
    build_lambda_context,
    compute_gae_lambda,
    constant_gae_lambda,
    relative_position_gae_lambda,
    resolve_gae_lambda_fn,
    vapo_length_adaptive_gae,
)
from ardea.algo.lambda_fn import check_lambda_output

VAPO = "ardea.algo.lambda_fn.vapo_length_adaptive_gae"
RELATIVE = "ardea.algo.lambda_fn.relative_position_gae_lambda"


def context(lengths):
    lengths = torch.tensor(lengths)
    return {"effective_token_lengths": lengths, "turn_counts": lengths, "timestep_lengths": lengths}


def test_static_lambda_ignores_kwargs_and_needs_no_turn_ids():
    lam = compute_gae_lambda(
        torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
        None,
        gae_lambda=0.25,
        gae_lambda_kwargs={"ignored": "value"},
    )
    torch.testing.assert_close(lam, torch.tensor([0.25, 0.25]), rtol=0, atol=0)


def test_vapo_uses_trained_token_counts_in_token_mode():
    loss_mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0, 0.0], [0.0] * 5])
    turn_ids = torch.tensor([[0, 0, 1, 1, -1], [0, 1, -1, -1, -1], [-1] * 5], dtype=torch.int32)
    lam = compute_gae_lambda(loss_mask, turn_ids, gae_lambda=VAPO, gae_lambda_kwargs={"alpha": 1.0})
    # 1 - 1/4, 1 - 1/2, empty -> 0
    torch.testing.assert_close(lam, torch.tensor([0.75, 0.5, 0.0]), rtol=0, atol=0)


def test_vapo_uses_distinct_turns_in_turn_mode():
    loss_mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0, 0.0], [0.0] * 5])
    turn_ids = torch.tensor([[0, 0, -1, 2, 2], [0, 0, 0, 0, -1], [-1] * 5], dtype=torch.int32)
    lam = compute_gae_lambda(
        loss_mask, turn_ids, gae_lambda=VAPO, gae_lambda_kwargs={"alpha": 1.0}, timestep_unit="turn"
    )
    # two turns -> 1 - 1/2; one turn -> max(0, 1 - 1) = 0; none -> 0
    torch.testing.assert_close(lam, torch.tensor([0.5, 0.0, 0.0]), rtol=0, atol=0)


def test_custom_token_lambda_without_turn_ids():
    lam = compute_gae_lambda(
        torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
        None,
        gae_lambda=VAPO,
        gae_lambda_kwargs={"alpha": 1.0},
    )
    torch.testing.assert_close(lam, torch.tensor([0.5, 0.0]), rtol=0, atol=0)


def test_relative_position_keeps_endpoints_and_relative_positions():
    q, lengths = 0.3, torch.tensor([10, 19])
    lam = relative_position_gae_lambda(context([10, 19]), q=q)
    torch.testing.assert_close(
        lam.pow((lengths - 1).float()), torch.full((2,), q), rtol=1e-6, atol=1e-7
    )
    # position 5 of 9 steps and 10 of 18 steps are the same relative position
    torch.testing.assert_close(
        lam.pow(torch.tensor([5.0, 10.0])), torch.full((2,), q ** (5.0 / 9.0)), rtol=1e-6, atol=1e-7
    )


def test_relative_position_empty_and_single_step():
    lam = relative_position_gae_lambda(context([0, 1, 2]), q=0.3)
    torch.testing.assert_close(lam, torch.tensor([0.0, 1.0, 0.3]), rtol=0, atol=1e-7)


@pytest.mark.parametrize("q", [True, -0.1, 0.0, 1.1, float("nan"), float("inf")])
def test_relative_position_rejects_invalid_q(q):
    with pytest.raises(ValueError, match=r"q must be .* in \(0, 1\]"):
        relative_position_gae_lambda(context([2]), q=q)


def test_relative_position_in_turn_mode_uses_turn_counts():
    turn_ids = torch.tensor([[0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 0, 0]], dtype=torch.int32)
    lam = compute_gae_lambda(
        torch.ones(2, 6),
        turn_ids,
        gae_lambda=RELATIVE,
        gae_lambda_kwargs={"q": 0.3},
        timestep_unit="turn",
    )
    torch.testing.assert_close(lam, torch.tensor([0.3**0.5, 1.0]), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), True])
def test_vapo_rejects_non_positive_alpha(alpha):
    with pytest.raises(ValueError, match="alpha must be a positive number"):
        vapo_length_adaptive_gae(context([0]), alpha=alpha)


def test_vapo_formula():
    lam = vapo_length_adaptive_gae(context([0, 10, 100, 1000]), alpha=0.05)
    expected = torch.tensor([0.0, max(0.0, 1 - 1 / 0.5), 1 - 1 / 5.0, 1 - 1 / 50.0])
    torch.testing.assert_close(lam, expected)


def test_custom_function_must_return_one_value_per_trajectory():
    def scalar_lambda(ctx):
        return torch.tensor(0.5)

    with pytest.raises(ValueError, match="one value per local trajectory"):
        compute_gae_lambda(
            torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.int32), gae_lambda=scalar_lambda
        )
    with pytest.raises(ValueError, match="one value per local trajectory"):
        check_lambda_output([0.5, 0.5], 2)
    with pytest.raises(ValueError, match=r"finite values in \[0, 1\]"):
        check_lambda_output(torch.tensor([0.5, float("nan")]), 2)


def test_resolve_numbers_paths_and_callables():
    fn, custom = resolve_gae_lambda_fn(0.9)
    assert not custom
    torch.testing.assert_close(fn(context([3, 4])), torch.tensor([0.9, 0.9]))
    assert resolve_gae_lambda_fn("0.5")[1] is False
    assert resolve_gae_lambda_fn(VAPO) == (vapo_length_adaptive_gae, True)
    assert resolve_gae_lambda_fn(constant_gae_lambda) == (constant_gae_lambda, True)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (float("nan"), "Static gae_lambda must be finite"),
        (float("inf"), "Static gae_lambda must be finite"),
        (True, "bool"),
        (1.5, r"\[0, 1\]"),
        ("nomodule", "dotted path"),
        ("ardea.no_such_module.fn", "cannot import"),
        ("ardea.algo.lambda_fn.no_such_function", "has no 'no_such_function'"),
        ("ardea.algo.lambda_fn.math", "is a module, not a function"),
        ([0.5], "number or a dotted path"),
    ],
)
def test_resolve_rejects_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        resolve_gae_lambda_fn(spec)


def test_context_counts_tokens_and_distinct_turns():
    loss_mask = torch.tensor([[1, 1, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    turn_ids = torch.tensor([[3, 3, -1, 5, 5, 9], [-1] * 6, [0, -1, -1, -1, -1, -1]])
    ctx = build_lambda_context(loss_mask, turn_ids, "turn")
    torch.testing.assert_close(
        ctx["effective_token_lengths"], torch.tensor([5, 0, 1]), rtol=0, atol=0
    )
    torch.testing.assert_close(ctx["turn_counts"], torch.tensor([3, 0, 1]), rtol=0, atol=0)
    torch.testing.assert_close(ctx["timestep_lengths"], torch.tensor([3, 0, 1]), rtol=0, atol=0)
    token_ctx = build_lambda_context(loss_mask, None, "token")
    torch.testing.assert_close(token_ctx["turn_counts"], torch.tensor([1, 0, 1]), rtol=0, atol=0)
    torch.testing.assert_close(
        token_ctx["timestep_lengths"], torch.tensor([5, 0, 1]), rtol=0, atol=0
    )


def test_context_errors():
    with pytest.raises(ValueError, match="requires rollout data.*turn_ids"):
        build_lambda_context(torch.ones(1, 2), None, "turn")
    with pytest.raises(ValueError, match="gae_timestep_unit"):
        build_lambda_context(torch.ones(1, 2), None, "episode")
    with pytest.raises(ValueError, match="turn_ids shape"):
        build_lambda_context(torch.ones(1, 2), torch.zeros(1, 3, dtype=torch.long), "turn")

"""KL estimators k1, k2, k3 and low_var_kl (Schulman's naming)."""

import math

import pytest
import torch

from ardea.algo import KL_ESTIMATORS, kl_penalty, topk_forward_kl

LOGP = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], dtype=torch.float64)
REF = torch.tensor([[-1.0, -1.0, -1.5, -0.1]], dtype=torch.float64)


def by_hand(estimator, logp, ref):
    log_ratio = logp - ref  # log(pi / pi_ref)
    r = math.exp(ref - logp)  # pi_ref / pi
    return {
        "k1": log_ratio,
        "k2": 0.5 * log_ratio**2,
        "k3": r - math.log(r) - 1,
        "low_var_kl": min(max(r - math.log(r) - 1, -10.0), 10.0),
    }[estimator]


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_estimators_match_their_formulas(estimator):
    out = kl_penalty(LOGP, REF, estimator)
    expected = [[by_hand(estimator, a, b) for a, b in zip(LOGP[0].tolist(), REF[0].tolist())]]
    assert out.shape == LOGP.shape
    torch.testing.assert_close(
        out, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12
    )


def test_k2_and_k3_are_non_negative_and_zero_on_equal_policies():
    x = torch.linspace(-5, 5, 41)
    for estimator in ("k2", "k3", "low_var_kl"):
        assert bool((kl_penalty(x, torch.zeros_like(x), estimator) >= 0).all())
        torch.testing.assert_close(kl_penalty(x, x, estimator), torch.zeros_like(x))


def test_low_var_kl_is_clamped_and_finite():
    logp = torch.tensor([-100.0, 0.0])
    ref = torch.tensor([0.0, -100.0])
    out = kl_penalty(logp, ref, "low_var_kl")
    assert bool(torch.isfinite(out).all())
    assert float(out.max()) == 10.0


def test_seed_grpo_k1_is_ardea_k3():
    # seed 002's GRPO "k1": r - log(r + 1e-8) - 1 with r = exp(ref - policy)
    gen = torch.Generator().manual_seed(0)
    policy = -torch.rand(3, 7, generator=gen) * 3
    ref = -torch.rand(3, 7, generator=gen) * 3
    r = torch.exp(ref - policy)
    seed_value = r - torch.log(r + 1e-8) - 1.0
    torch.testing.assert_close(kl_penalty(policy, ref, "k3"), seed_value, rtol=1e-5, atol=1e-6)


def test_seed_ppo_k3_is_ardea_k1():
    # seed 001 folds "k3" = behaviour logprobs - ref logprobs: +1 per token
    torch.testing.assert_close(
        kl_penalty(torch.ones(1, 2), torch.zeros(1, 2), "k1"), torch.ones(1, 2)
    )


def test_k1_and_k3_are_unbiased_estimates_of_the_true_kl():
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    true_kl = float((p * (p / q).log()).sum())
    samples = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    logp, logq = p.log()[samples], q.log()[samples]
    for estimator in ("k1", "k3"):
        assert abs(float(kl_penalty(logp, logq, estimator).mean()) - true_kl) < 5e-3


def test_gradient_flows_to_the_policy():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    kl_penalty(logp, torch.tensor([-1.5, -1.5]), "k3").sum().backward()
    # d/dx [exp(-(x - ref)) + (x - ref) - 1] = 1 - exp(ref - x)
    torch.testing.assert_close(logp.grad, 1 - torch.exp(torch.tensor([-0.5, 0.5])))


def test_errors_name_the_problem():
    with pytest.raises(
        ValueError, match="unknown KL estimator 'k4'; known estimators: k1, k2, k3, low_var_kl"
    ):
        kl_penalty(LOGP, REF, "k4")
    with pytest.raises(ValueError, match="shape"):
        kl_penalty(LOGP, REF[:, :2], "k1")
    with pytest.raises(TypeError, match="floating-point"):
        kl_penalty(torch.zeros(2, dtype=torch.long), torch.zeros(2), "k1")


def test_topk_forward_kl_by_hand():
    """Teacher top 2 of (0.5, 0.3, 0.2): renormalised q~ = (0.625, 0.375); student p of the
    same tokens (0.25, 0.5): KL = 0.625 ln(0.625/0.25) + 0.375 ln(0.375/0.5) = 0.4648014;
    d KL / d log p = -q~."""
    teacher = torch.tensor([[math.log(0.5), math.log(0.3)]], dtype=torch.float64)
    student = torch.tensor([[math.log(0.25), math.log(0.5)]], dtype=torch.float64)
    student.requires_grad_(True)
    kl = topk_forward_kl(student, teacher)
    expected = 0.625 * math.log(2.5) + 0.375 * math.log(0.75)
    assert kl.shape == (1,) and float(kl.detach()) == pytest.approx(expected, abs=1e-12)
    kl.sum().backward()
    torch.testing.assert_close(student.grad, torch.tensor([[-0.625, -0.375]], dtype=torch.float64))


def test_topk_forward_kl_over_the_whole_vocabulary_is_the_exact_kl():
    """k = V: sum_v q_v (log q_v - log p_v), and 0 when the student is the teacher."""
    g = torch.Generator().manual_seed(0)
    q = torch.log_softmax(torch.randn(3, 4, 7, generator=g, dtype=torch.float64), -1)
    p = torch.log_softmax(torch.randn(3, 4, 7, generator=g, dtype=torch.float64), -1)
    exact = (q.exp() * (q - p)).sum(-1)
    torch.testing.assert_close(topk_forward_kl(p, q), exact, atol=1e-12, rtol=0)
    torch.testing.assert_close(topk_forward_kl(q, q), torch.zeros(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="must match teacher_logprobs shape"):
        topk_forward_kl(p[..., :3], q)

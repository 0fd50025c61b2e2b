"""Per-token KL estimators between the policy and a reference policy.

Reference: J. Schulman, "Approximating KL Divergence" (2020), http://joschu.net/blog/kl-approx.html.
Tokens are sampled from the policy ``pi``; the estimated quantity is ``KL(pi || pi_ref)``.

Sign convention: ``log_ratio = logprobs - ref_logprobs = log(pi / pi_ref)``, and
``r = pi_ref / pi = exp(-log_ratio)`` is Schulman's ratio, so:

=============  ==============================  ==========================================
name           per-token value                 properties
=============  ==============================  ==========================================
``k1``         ``log_ratio``                   unbiased, high variance, can be negative
``k2``         ``0.5 * log_ratio ** 2``        biased, low variance, >= 0
``k3``         ``r - log(r) - 1``              unbiased, low variance, >= 0
               ``= exp(-log_ratio) + log_ratio - 1``
``low_var_kl``  ``clamp(k3, -10, 10)``          k3 with ``-log_ratio`` clamped to [-20, 20]
=============  ==============================  ==========================================

Naming note: the seed's GRPO strategy calls ``r - log(r + 1e-8) - 1`` "k1"; in ardea that is
``k3`` (without the 1e-8). Its PPO strategy calls ``logprobs - ref_logprobs`` "k3"; in ardea
that is ``k1``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ardea.algo._checks import check_float

KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")
LOW_VAR_KL_CLAMP = 10.0
LOG_RATIO_CLAMP = 20.0


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k1") -> Tensor:
    """Per-token estimate of ``KL(pi || pi_ref)`` from sampled-token log-probs.

    Args:
        logprobs: ``(N, S)`` (any shape) policy log-probs of the sampled tokens.
        ref_logprobs: same shape, reference-policy log-probs of the same tokens.
        estimator: one of ``KL_ESTIMATORS`` (see the module docstring for formulas).

    Returns:
        Tensor of the same shape; differentiable in both inputs.

    Raises:
        ValueError: unknown estimator (the message lists the known ones) or shape mismatch.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(
            f"unknown KL estimator {estimator!r}; known estimators: {', '.join(KL_ESTIMATORS)}"
        )
    _check_pair("logprobs", logprobs, "ref_logprobs", ref_logprobs)
    log_ratio = logprobs - ref_logprobs  # log(pi / pi_ref)
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        return torch.exp(-log_ratio) + log_ratio - 1.0
    neg = (-log_ratio).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # log r, clamped before exp
    return (torch.exp(neg) - neg - 1.0).clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)


def topk_forward_kl(student_logprobs: Tensor, teacher_logprobs: Tensor) -> Tensor:
    """Per-position forward KL ``KL(q̃ || p)`` over a teacher's top-k tokens (distillation).

    With the teacher's log-probs ``log q_j`` of its ``k`` most likely tokens and the
    student's log-probs ``log p_j`` of the same tokens, ``q̃ = softmax(log q)`` renormalises
    the teacher over its top k and

        KL_t = sum_j q̃_j (log q̃_j - log p_j).

    With k = V it is the exact ``KL(q || p)``. It is ``>= -log sum_j p_j >= 0``, 0 when the
    student puts all its mass on the top k in the teacher's proportions; its gradient in
    the student is ``-sum_j q̃_j ∇ log p_j`` (cross-entropy towards the teacher).

    Args:
        student_logprobs: ``(..., k)`` log p, differentiable.
        teacher_logprobs: ``(..., k)`` log q (the full distribution's, not renormalised).

    Returns:
        ``(...)`` in the student's dtype.
    """
    _check_pair("student_logprobs", student_logprobs, "teacher_logprobs", teacher_logprobs)
    teacher = torch.log_softmax(teacher_logprobs.to(student_logprobs.dtype), dim=-1)
    return (teacher.exp() * (teacher - student_logprobs)).sum(dim=-1)


def _check_pair(name: str, x: Tensor, other_name: str, other: Tensor) -> None:
    """Both float tensors of one shape, else a ValueError naming them."""
    check_float(name, x)
    check_float(other_name, other)
    if x.shape != other.shape:
        raise ValueError(
            f"{name} shape {tuple(x.shape)} must match {other_name} shape {tuple(other.shape)}"
        )

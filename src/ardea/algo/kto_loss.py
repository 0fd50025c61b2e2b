"""KTO: the Kahneman-Tversky loss on unpaired desirable / undesirable completions.

Reference: Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic
Optimization", eq. 8. Per example ``(x, y)`` with a label (desirable or not), the implied
reward is the sequence log-ratio ``r = log pi(y|x) - log pi_ref(y|x)`` and the reference
point ``z`` an estimate of ``KL(pi || pi_ref)``, taken on *mismatched* pairs (a prompt with
another example's completion), averaged, clamped at 0 and detached
(:func:`kto_logratio_sum` and :func:`kto_kl_estimate`: the sum and the mean are apart so that
the mean can be taken over more than one batch):

    desirable:    w_D * (1 - sigmoid(beta * (r - z)))
    undesirable:  w_U * (1 - sigmoid(beta * (z - r)))

The loss is the sum over examples divided by ``global_examples`` (the examples of the whole
optimizer step, so micro-batch losses add up): TRL's mean over the batch.

Metrics (detached): ``loss/kto``; ``loss/rewards_chosen`` / ``loss/rewards_rejected``
(mean ``beta * r`` over the desirable / undesirable examples, divided by
``global_desirable`` / ``global_undesirable``), ``loss/rewards_margins`` (their
difference), ``loss/logps_chosen`` / ``loss/logps_rejected`` (mean ``log pi(y|x)`` of each
kind). TRL's KTO trainer logs the same under ``rewards/chosen`` and so on.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ardea.algo._checks import check_float, check_shape
from ardea.algo.preference_loss import pair_count


def kto_logratio_sum(policy_logps: Tensor, ref_logps: Tensor) -> Tensor:
    """``sum_i (log pi(y'_i|x_i) - log pi_ref(y'_i|x_i))``, 0-d and detached, over ``(M,)``
    sequence log-probs of mismatched prompt / completion pairs: what one batch adds to the
    reference point's estimate (:func:`kto_kl_estimate`)."""
    check_float("policy_logps", policy_logps)
    check_shape("ref_logps", ref_logps, policy_logps.shape, "(M,)")
    return (policy_logps.detach() - ref_logps.detach()).sum()


def kto_kl_estimate(logratio_sum: Tensor | float, pairs: float) -> Tensor:
    """``z = max(0, logratio_sum / pairs)``: the mean log-ratio of ``pairs`` mismatched
    pairs (their :func:`kto_logratio_sum`, added over every batch it covers), clamped at 0;
    0 for ``pairs = 0``. A 0-d float32 tensor."""
    total = torch.as_tensor(logratio_sum, dtype=torch.float32).detach()
    if pairs <= 0:
        return torch.zeros((), dtype=torch.float32, device=total.device)
    return (total / pairs).clamp(min=0)


def kto_loss(
    policy_logps: Tensor,
    ref_logps: Tensor,
    desirable: Tensor,
    kl: Tensor,
    *,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    global_examples: float | None = None,
    global_desirable: float | None = None,
    global_undesirable: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KTO over ``(N,)`` sequence log-probs of the examples under the policy and the
    reference, their ``(N,)`` bool labels and the 0-d reference point ``kl`` (module
    docstring). The ``global_*`` counts default to this batch's.

    Returns:
        ``(loss, metrics)``; ``loss`` is 0-d, 0 for ``N = 0``.
    """
    # beta, the (N,) log-probs and the example count: checked as the pair losses check theirs
    examples = pair_count("beta", beta, global_examples, policy_logps=policy_logps,
                          ref_logps=ref_logps)  # fmt: skip
    for name, weight in (("desirable_weight", desirable_weight),
                         ("undesirable_weight", undesirable_weight)):  # fmt: skip
        if isinstance(weight, bool) or not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"{name} must be a positive number, got {weight!r}")
    check_shape("desirable", desirable, policy_logps.shape, "(N,)")
    if desirable.dtype != torch.bool:
        raise ValueError(f"desirable must be a bool tensor, got {desirable.dtype}")
    if kl.dim() != 0:
        raise ValueError(f"kl must be a 0-d tensor, got shape {tuple(kl.shape)}")
    if global_desirable is None or global_undesirable is None:  # this batch's (a host sync)
        global_desirable = float(desirable.sum())
        global_undesirable = desirable.numel() - global_desirable
    chosen_count, rejected_count = max(global_desirable, 1.0), max(global_undesirable, 1.0)
    ratio = policy_logps - ref_logps.detach()  # (N,) implied rewards / beta
    z = kl.detach()
    chosen = desirable_weight * (1 - torch.sigmoid(beta * (ratio - z)))
    rejected = undesirable_weight * (1 - torch.sigmoid(beta * (z - ratio)))
    loss = torch.where(desirable, chosen, rejected).sum() / examples
    rewards, logps = beta * ratio.detach(), policy_logps.detach()
    zero = rewards.new_zeros(())
    chosen_reward = torch.where(desirable, rewards, zero).sum() / chosen_count
    rejected_reward = torch.where(desirable, zero, rewards).sum() / rejected_count
    return loss, {
        "loss/kto": loss.detach(),
        "loss/rewards_chosen": chosen_reward,
        "loss/rewards_rejected": rejected_reward,
        "loss/rewards_margins": chosen_reward - rejected_reward,
        "loss/logps_chosen": torch.where(desirable, logps, zero).sum() / chosen_count,
        "loss/logps_rejected": torch.where(desirable, zero, logps).sum() / rejected_count,
    }

"""Preference losses on sequence log-probs: DPO and IPO.

With ``h = (log pi(y_w) - log pi(y_l)) - (log pi_ref(y_w) - log pi_ref(y_l))`` per pair
(``y_w`` chosen, ``y_l`` rejected; sequence log-probs, usually summed over the response):

- DPO (Rafailov et al. 2023, eq. 7): ``l = -log sigmoid(beta * h)``;
- IPO (Azar et al. 2023, eq. 17 with tau = beta): ``l = (h - 1 / (2 beta))^2`` -- the
  paper (and TRL) feed length-averaged log-probs here; the caller chooses.

Losses are means over pairs, normalized by ``global_pairs`` when given (the pair count
of the whole batch, so that micro-batch losses add up). Metrics (detached, ``loss/``):
``loss/dpo`` or ``loss/ipo``; ``loss/reward_chosen`` and ``loss/reward_rejected``
(``beta * (log pi - log pi_ref)``), ``loss/reward_margin`` and ``loss/reward_accuracy``
(fraction of pairs with chosen reward > rejected reward), all over ``global_pairs``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ardea.algo._checks import check_finite, check_float, check_shape


def pair_count(weight_name: str, weight: float, global_pairs, **logps: Tensor) -> Tensor:
    """Check a pair loss's positive ``weight`` and its ``(N,)`` per-pair tensors (float,
    one shape, finite); the count its per-pair sum is divided by: ``global_pairs`` (the
    whole step's pairs) or N, at least 1, as a 0-d tensor."""
    if isinstance(weight, bool) or not (math.isfinite(weight) and weight > 0):
        raise ValueError(f"{weight_name} must be a positive number, got {weight!r}")
    first = next(iter(logps.values()))
    if first.dim() != 1:
        raise ValueError(f"sequence log-probs must have shape (N,), got {tuple(first.shape)}")
    for name, x in logps.items():
        check_float(name, x)
        check_shape(name, x, first.shape, "(N,)")
        check_finite(name, x.detach())
    if global_pairs is not None and (isinstance(global_pairs, bool) or global_pairs < 0):
        raise ValueError(f"global_pairs must be a non-negative count, got {global_pairs!r}")
    count = max(first.shape[0] if global_pairs is None else float(global_pairs), 1)
    return torch.as_tensor(count, dtype=first.dtype, device=first.device)


PAIR_LOGPS = ("policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps",
              "ref_rejected_logps")  # fmt: skip


def _pair_inputs(beta: float, global_pairs, *logps: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The ``(N,)`` implicit log-ratios of the chosen and rejected replies from the four
    :data:`PAIR_LOGPS` (checked), and the pair count."""
    count = pair_count("beta", beta, global_pairs, **dict(zip(PAIR_LOGPS, logps, strict=True)))
    pc, pr, rc, rr = logps
    chosen, rejected = pc - rc.detach(), pr - rr.detach()  # (N,) implicit log-ratios
    return chosen, rejected, count


def _metrics(name: str, loss: Tensor, chosen: Tensor, rejected: Tensor, beta: float, count):
    rw, rl = beta * chosen.detach(), beta * rejected.detach()
    return {
        f"loss/{name}": loss.detach(),
        "loss/reward_chosen": rw.sum() / count,
        "loss/reward_rejected": rl.sum() / count,
        "loss/reward_margin": (rw - rl).sum() / count,
        "loss/reward_accuracy": (rw > rl).to(rw.dtype).sum() / count,
    }


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float = 0.1,
    global_pairs: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPO: ``sum_i -log sigmoid(beta * h_i) / P`` over ``(N,)`` sequence log-probs.

    Returns:
        ``(loss, metrics)``; ``loss`` is 0-d, 0 for ``N = 0``.
    """
    chosen, rejected, count = _pair_inputs(beta, global_pairs, policy_chosen_logps,
                                           policy_rejected_logps, ref_chosen_logps,
                                           ref_rejected_logps)  # fmt: skip
    per_pair = -F.logsigmoid(beta * (chosen - rejected))  # (N,)
    loss = per_pair.sum() / count
    return loss, _metrics("dpo", loss, chosen, rejected, beta, count)


def ipo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float = 0.1,
    global_pairs: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """IPO: ``sum_i (h_i - 1 / (2 beta))^2 / P`` over ``(N,)`` sequence log-probs.

    Returns:
        ``(loss, metrics)``.
    """
    chosen, rejected, count = _pair_inputs(beta, global_pairs, policy_chosen_logps,
                                           policy_rejected_logps, ref_chosen_logps,
                                           ref_rejected_logps)  # fmt: skip
    per_pair = (chosen - rejected - 1.0 / (2.0 * beta)).square()
    loss = per_pair.sum() / count
    return loss, _metrics("ipo", loss, chosen, rejected, beta, count)

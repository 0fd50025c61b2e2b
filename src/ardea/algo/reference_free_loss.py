"""Reference-free preference losses on length-averaged sequence log-probs: SimPO and ORPO.

Per pair, with ``a_w = (1/|y_w|) sum_t log pi(y_w,t)`` and ``a_l`` the same for the rejected
reply (the policy's mean token log-prob over each response; no reference model):

- SimPO (Meng et al. 2024, eq. 6): ``l = -log sigmoid(beta * (a_w - a_l) - gamma)``, a
  length-normalised implicit reward ``beta * a`` that the chosen reply must beat by the
  margin ``gamma``;
- ORPO (Hong et al. 2024, eqs. 6-7): with the odds ``odds(y) = p / (1 - p)``, ``p = exp(a)``,
  ``l = nll_w + lam * -log sigmoid(log odds(y_w) - log odds(y_l))``, where ``nll_w`` is the
  chosen reply's negative log-likelihood (its SFT loss, per token) and
  ``log odds(y) = a - log(1 - exp(a))``.

Losses are sums over pairs divided by ``global_pairs`` (the pairs of the whole optimizer
step, so micro-batch losses add up). Metrics (detached, over ``global_pairs``), named as
TRL's CPO / ORPO trainers name them: ``loss/simpo`` or ``loss/orpo``;
``loss/rewards_chosen`` / ``loss/rewards_rejected`` (``beta * a``; ORPO: ``lam * a``),
``loss/rewards_margins``, ``loss/rewards_accuracies`` (fraction with chosen > rejected);
ORPO also ``loss/nll`` and ``loss/log_odds_ratio`` (mean ``log sigmoid`` of the odds
ratio) and ``loss/log_odds_chosen`` (mean ``log odds(y_w) - log odds(y_l)``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ardea.algo.preference_loss import pair_count


def _reward_metrics(chosen: Tensor, rejected: Tensor, count: Tensor) -> dict[str, Tensor]:
    rw, rl = chosen.detach(), rejected.detach()
    return {
        "loss/rewards_chosen": rw.sum() / count,
        "loss/rewards_rejected": rl.sum() / count,
        "loss/rewards_margins": (rw - rl).sum() / count,
        "loss/rewards_accuracies": (rw > rl).to(rw.dtype).sum() / count,
    }


def simpo_loss(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    *,
    beta: float = 2.0,
    gamma: float = 0.5,
    global_pairs: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SimPO: ``sum_i -log sigmoid(beta (a_w - a_l) - gamma) / P`` over ``(N,)``
    length-averaged log-probs of the chosen and rejected replies (module docstring).

    Returns:
        ``(loss, metrics)``; ``loss`` is 0-d, 0 for ``N = 0``.
    """
    count = pair_count("beta", beta, global_pairs, chosen_logps=chosen_logps,
                   rejected_logps=rejected_logps)  # fmt: skip
    if not math.isfinite(gamma):
        raise ValueError(f"gamma must be finite, got {gamma!r}")
    per_pair = -F.logsigmoid(beta * (chosen_logps - rejected_logps) - gamma)  # (N,)
    loss = per_pair.sum() / count
    metrics = {"loss/simpo": loss.detach()}
    return loss, metrics | _reward_metrics(beta * chosen_logps, beta * rejected_logps, count)


def orpo_loss(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    chosen_nll: Tensor,
    *,
    lam: float = 0.1,
    global_pairs: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """ORPO: ``sum_i (nll_w,i + lam * -log sigmoid(log odds_w - log odds_l)) / P`` over
    ``(N,)`` length-averaged log-probs (< 0) and the chosen replies' per-token NLL
    (module docstring).

    Returns:
        ``(loss, metrics)``.
    """
    count = pair_count("lam", lam, global_pairs, chosen_logps=chosen_logps,
                   rejected_logps=rejected_logps, chosen_nll=chosen_nll)  # fmt: skip
    # log odds = a - log(1 - e^a); log1p(-exp(a)) is exact for a < 0 (a mean log-prob)
    log_odds = (chosen_logps - torch.log1p(-torch.exp(chosen_logps))) - (
        rejected_logps - torch.log1p(-torch.exp(rejected_logps))
    )  # (N,)
    ratio = F.logsigmoid(log_odds)  # (N,)
    loss = (chosen_nll - lam * ratio).sum() / count
    metrics = {
        "loss/orpo": loss.detach(),
        "loss/nll": chosen_nll.detach().sum() / count,
        "loss/log_odds_ratio": ratio.detach().sum() / count,
        "loss/log_odds_chosen": log_odds.detach().sum() / count,
    }
    return loss, metrics | _reward_metrics(lam * chosen_logps, lam * rejected_logps, count)

"""The Bradley–Terry loss of a reward model on preference pairs.

A reward model gives each text one score ``r``. Under the Bradley–Terry model the chosen
reply ``y_w`` is preferred to the rejected ``y_l`` with probability
``sigmoid(r_w - r_l)`` (Bradley & Terry 1952; Ouyang et al. 2022, eq. 1), so per pair

    l = -log sigmoid(r_w - r_l - m) + c * (r_w + r_l)^2

with ``m`` a margin the chosen reply must win by (Llama 2, Touvron et al. 2023, eq. 2;
0 = plain Bradley–Terry) and ``c`` the weight of a penalty that keeps the scores centred on
zero (Eisenstein et al. 2023; TRL's ``center_rewards_coefficient``; 0 = off). The loss is
the sum over pairs divided by ``global_pairs`` (the pairs of the whole optimizer step, so
micro-batch losses add up). Metrics (detached, over ``global_pairs``): ``loss/bt`` (the
Bradley–Terry part), ``loss/score_chosen``, ``loss/score_rejected``, ``loss/score_margin``
(mean ``r_w - r_l``) and ``loss/accuracy`` (fraction of pairs with ``r_w > r_l``; a tie
counts as wrong).
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor

from ardea.algo._checks import check_finite, check_float, check_shape


def bradley_terry_loss(
    chosen: Tensor,
    rejected: Tensor,
    *,
    margin: float = 0.0,
    center_coef: float = 0.0,
    global_pairs: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``sum_i l_i / P`` (module docstring) over ``(N,)`` scores of the chosen and the
    rejected reply of ``N`` pairs.

    Returns:
        ``(loss, metrics)``; ``loss`` is 0-d, 0 for ``N = 0``.
    """
    for name, value in (("margin", margin), ("center_coef", center_coef)):
        if isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if center_coef < 0:
        raise ValueError(f"center_coef must be >= 0, got {center_coef!r}")
    if chosen.dim() != 1:
        raise ValueError(f"scores must have shape (N,), got {tuple(chosen.shape)}")
    for name, x in (("chosen", chosen), ("rejected", rejected)):
        check_float(name, x)
        check_shape(name, x, chosen.shape, "(N,)")
        check_finite(name, x.detach())
    if global_pairs is not None and (isinstance(global_pairs, bool) or global_pairs < 0):
        raise ValueError(f"global_pairs must be a non-negative count, got {global_pairs!r}")
    count = max(float(chosen.shape[0] if global_pairs is None else global_pairs), 1.0)
    difference = chosen - rejected  # (N,)
    bt = -F.logsigmoid(difference - margin)  # (N,)
    per_pair = bt + center_coef * (chosen + rejected).square() if center_coef else bt
    loss = per_pair.sum() / count
    d = difference.detach()
    metrics = {
        "loss/bt": bt.detach().sum() / count,
        "loss/score_chosen": chosen.detach().sum() / count,
        "loss/score_rejected": rejected.detach().sum() / count,
        "loss/score_margin": d.sum() / count,
        "loss/accuracy": (d > 0).to(d.dtype).sum() / count,
    }
    return loss, metrics

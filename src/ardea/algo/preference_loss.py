"""Preference losses on sequence log-probs: DPO and IPO.

With ``h = (log pi(y_w) - log pi(y_l)) - (log pi_ref(y_w) - log pi_ref(y_l))`` per pair
(``y_w`` chosen, ``y_l`` rejected; sequence log-probs, usually summed over the response):

- DPO (Rafailov et al. 2023, eq. 7): ``l = -log sigmoid(beta * h)``;
- IPO (Azar et al. 2023, eq. 17 with tau = beta): ``l = (h - 1 / (2 beta))^2`` -- the
  paper (and TRL) feed length-averaged log-probs here; the caller chooses.

A loss reads :class:`PairLogps` (the four sequence log-probs of N pairs). Losses
are means over pairs, normalized by ``global_pairs`` when given (the pair count
of the whole batch, so that micro-batch losses add up). Metrics (detached, ``loss/``):
``loss/dpo`` or ``loss/ipo``; ``loss/reward_chosen`` and ``loss/reward_rejected``
(``beta * (log pi - log pi_ref)``), ``loss/reward_margin`` and ``loss/reward_accuracy``
(fraction of pairs with chosen reward > rejected reward), all over ``global_pairs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

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


@dataclass(frozen=True)
class PairLogps:
    """``N`` preference pairs as a pair loss reads them: the ``(N,)`` sequence log-probs of
    the chosen and the rejected reply under the trained policy (with gradient) and under the
    frozen reference, and ``global_pairs``, the whole step's pair count the per-pair sum is
    divided by (None: ``N``; micro-batch losses then add up to the step's)."""

    policy_chosen_logps: Tensor
    policy_rejected_logps: Tensor
    ref_chosen_logps: Tensor
    ref_rejected_logps: Tensor
    global_pairs: int | None = None

    def logratios(self, beta: float) -> tuple[Tensor, Tensor, Tensor]:
        """The ``(N,)`` implicit log-ratios ``log pi - log pi_ref`` of the chosen and of the
        rejected replies (the reference's detached), and the 0-d pair count; ValueError for
        a non-positive ``beta`` or log-probs of other shapes, dtypes or non-finite values."""
        logps = {name: getattr(self, name) for name in _LOGPS}
        count = pair_count("beta", beta, self.global_pairs, **logps)
        chosen = self.policy_chosen_logps - self.ref_chosen_logps.detach()
        rejected = self.policy_rejected_logps - self.ref_rejected_logps.detach()
        return chosen, rejected, count


_LOGPS = tuple(f.name for f in fields(PairLogps) if f.name.endswith("_logps"))


def _reduce(name: str, per_pair: Tensor, chosen: Tensor, rejected: Tensor, beta: float, count):
    """The loss ``sum(per_pair) / count`` and its metrics (module docstring)."""
    loss = per_pair.sum() / count
    rw, rl = beta * chosen.detach(), beta * rejected.detach()
    return loss, {
        f"loss/{name}": loss.detach(),
        "loss/reward_chosen": rw.sum() / count,
        "loss/reward_rejected": rl.sum() / count,
        "loss/reward_margin": (rw - rl).sum() / count,
        "loss/reward_accuracy": (rw > rl).to(rw.dtype).sum() / count,
    }


def dpo_loss(pairs: PairLogps, *, beta: float = 0.1) -> tuple[Tensor, dict[str, Tensor]]:
    """DPO: ``sum_i -log sigmoid(beta * h_i) / P``; ``(loss, metrics)``, the loss 0-d (0 for
    no pairs)."""
    chosen, rejected, count = pairs.logratios(beta)
    per_pair = -F.logsigmoid(beta * (chosen - rejected))  # (N,)
    return _reduce("dpo", per_pair, chosen, rejected, beta, count)


def ipo_loss(pairs: PairLogps, *, beta: float = 0.1) -> tuple[Tensor, dict[str, Tensor]]:
    """IPO: ``sum_i (h_i - 1 / (2 beta))^2 / P``; ``(loss, metrics)``."""
    chosen, rejected, count = pairs.logratios(beta)
    per_pair = (chosen - rejected - 1.0 / (2.0 * beta)).square()  # (N,)
    return _reduce("ipo", per_pair, chosen, rejected, beta, count)

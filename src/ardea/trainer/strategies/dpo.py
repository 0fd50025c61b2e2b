"""Direct preference optimization (``dpo``), with the IPO variant.

Reference: Rafailov et al. 2023, "Direct Preference Optimization", eq. 7 (``algo.dpo_loss =
sigmoid``); Azar et al. 2023, IPO, eq. 17 (``ipo``); both as implemented once in
:func:`ardea.algo.dpo_loss` / :func:`ardea.algo.ipo_loss`.

For each pair the sequence log-prob of a response under a model is
``log pi(y) = sum_t m[t] * logprobs[t]`` (``algo.dpo_reduction = sum``) or that sum divided
by ``sum_t m[t]`` (``mean``), with ``m`` the batch's action mask (response tokens, next-token
aligned). The policy scores chosen and rejected in one ``[2P, S]`` forward; a frozen
reference (built once for the run, :mod:`ardea.trainer.scorers`; eval mode, no gradients) scores the same rows
once per step (:class:`~ardea.trainer.scorers.token_scorer.TokenScorer`). The loss is ``sum_pairs l / P_step`` with ``P_step`` the pairs of the
whole optimizer step, ``l = -log sigmoid(beta * h)`` (DPO) or ``(h - 1 / (2 beta))^2`` (IPO),
``h = (log pi(y_w) - log pi(y_l)) - (log pi_ref(y_w) - log pi_ref(y_l))``.

Batch: a :class:`~ardea.data.TrajectoryBatch` in the preference layout
(:func:`ardea.data.preference_pairs`): ``P`` chosen rows, then their ``P`` rejected rows.

Metrics (sums over micro-batches give the step value): ``train/loss``, ``train/dpo_loss``
(or ``train/ipo_loss``), ``train/reward_chosen`` / ``train/reward_rejected`` (mean of
``beta * (log pi - log pi_ref)``), ``train/reward_margin`` (their difference),
``train/reward_accuracy`` (fraction of pairs with chosen reward > rejected reward),
``train/logps_chosen`` / ``train/logps_rejected`` (mean policy sequence log-probs), and the
MoE metrics for MoE policies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ardea import data
from ardea.algo import PairLogps, dpo_loss, ipo_loss
from ardea.data import TrajectoryBatch, preference_pairs
from ardea.model import sequence_logprobs
from ardea.trainer.moe_terms import MoETerms
from ardea.trainer.strategies.base import Strategy, register_strategy

PREFERENCE_LOSSES = {"sigmoid": (dpo_loss, "dpo"), "ipo": (ipo_loss, "ipo")}


def sequence_logps(logprobs: Tensor, mask: Tensor, reduction: str) -> Tensor:
    """``(N,)`` sum (or mean) over ``mask (N, S)`` of next-token ``logprobs (N, S)``."""
    total = torch.where(mask, logprobs, 0.0).sum(dim=-1)  # (N,)
    if reduction == "mean":
        return total / mask.sum(dim=-1).clamp(min=1).to(total.dtype)
    return total


class PreferencePairs(Strategy):
    """What every strategy on preference pairs shares: the batch layout (``P`` chosen rows,
    then their ``P`` rejected rows) and the step's pair count its loss is divided by."""

    sample_kind = "preference"
    moe: MoETerms

    def collate(self, samples: Sequence[Any]) -> TrajectoryBatch:
        return data.collate_preference(samples, self.tokenizer.pad_token_id)

    def step_counts(self, micro_batches: list[TrajectoryBatch]) -> dict[str, float]:
        pairs = float(sum(len(preference_pairs(b)[0]) for b in micro_batches))
        return {"pairs": pairs} | self.moe.step_counts(micro_batches)


@register_strategy("dpo")
class DPOStrategy(PreferencePairs):
    """DPO / IPO against a frozen reference (module docstring)."""

    uses_reference = True

    def __init__(self, policy: nn.Module, config: Any, **kwargs: Any) -> None:
        super().__init__(policy, config, **kwargs)
        algo = config.algo
        self.loss_fn, self.loss_name = PREFERENCE_LOSSES[algo.dpo_loss]
        self.beta = 0.1 if algo.beta is None else float(algo.beta)
        self.reduction = algo.dpo_reduction
        self.moe = MoETerms(policy, algo.moe_aux_loss_coef)

    def loss(
        self, batch: TrajectoryBatch, step_counts: dict[str, float]
    ) -> tuple[Tensor, dict[str, Tensor | float]]:
        chosen, rejected = preference_pairs(batch)  # (P,) row indices each
        mask = batch.action_mask  # (2P, S)
        chunk = self.config.model.logprob_chunk_size
        out = sequence_logprobs(self.policy, **batch.model_inputs(), chunk_size=chunk)
        logps = sequence_logps(out.logprobs, mask, self.reduction)  # (2P,)
        ref_logps = sequence_logps(self.reference.logprobs(batch), mask, self.reduction)  # (2P,)
        pairs = step_counts["pairs"]
        loss, parts = self.loss_fn(
            PairLogps(logps[chosen], logps[rejected], ref_logps[chosen], ref_logps[rejected],
                            global_pairs=pairs),
            beta=self.beta,
        )  # fmt: skip
        metrics = {f"train/{self.loss_name}_loss": parts[f"loss/{self.loss_name}"].detach()}
        for name in ("reward_chosen", "reward_rejected", "reward_margin", "reward_accuracy"):
            metrics[f"train/{name}"] = parts[f"loss/{name}"].detach()
        metrics["train/logps_chosen"] = logps[chosen].detach().sum() / max(pairs, 1.0)
        metrics["train/logps_rejected"] = logps[rejected].detach().sum() / max(pairs, 1.0)
        loss, moe_metrics = self.moe.add(loss, out, batch, step_counts)
        return loss, {"train/loss": loss.detach(), **metrics, **moe_metrics}

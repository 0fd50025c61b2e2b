"""Preference optimisation without a reference model: SimPO (``simpo``) and ORPO (``orpo``).

Both train on the DPO data format (``prompt``, ``chosen``, ``rejected``; or a task's
built-in right / wrong pairs) and score each reply by the policy's *mean* token log-prob
over the response, ``a = (1/|y|) sum_t m[t] * logprobs[t]`` (``m`` the batch's action mask,
next-token aligned), in one ``[2P, S]`` forward. No frozen copy of the model is kept.

- ``simpo`` (Meng et al. 2024): ``-log sigmoid(beta (a_w - a_l) - gamma)``,
  ``algo.beta`` (default 2.0) and ``algo.simpo_gamma`` (0.5);
- ``orpo`` (Hong et al. 2024): the chosen reply's SFT loss ``-a_w`` plus ``lambda *
  -log sigmoid(log odds(y_w) - log odds(y_l))``, ``lambda = algo.beta`` (default 0.1).

The formulas live once in :func:`ardea.algo.simpo_loss` / :func:`ardea.algo.orpo_loss`;
the loss is their sum over pairs divided by the pairs of the whole optimizer step.

Metrics (sums over micro-batches give the step value): ``train/loss``, ``train/simpo`` or
``train/orpo`` (with ``train/nll``, ``train/log_odds_ratio``, ``train/log_odds_chosen``),
``train/rewards_chosen``, ``train/rewards_rejected``, ``train/rewards_margins``,
``train/rewards_accuracies`` (TRL's names), ``train/logps_chosen`` / ``train/logps_rejected``
(mean ``a``); held out, ``eval/loss`` and ``eval/rewards_accuracies``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor, nn

from ardea.algo import orpo_loss, simpo_loss
from ardea.data import TrajectoryBatch, preference_pairs
from ardea.model import sequence_logprobs
from ardea.trainer.moe_terms import MoETerms
from ardea.trainer.strategies.base import register_strategy
from ardea.trainer.strategies.dpo import PreferencePairs, sequence_logps


class ReferenceFreePreference(PreferencePairs):
    """What SimPO and ORPO share (module docstring); subclasses give :meth:`pair_loss`."""

    eval_metrics = ("rewards_accuracies",)
    default_beta: ClassVar[float]

    def __init__(self, policy: nn.Module, config: Any, **kwargs: Any) -> None:
        super().__init__(policy, config, **kwargs)
        algo = config.algo
        self.beta = self.default_beta if algo.beta is None else float(algo.beta)
        self.moe = MoETerms(policy, algo.moe_aux_loss_coef)

    def pair_loss(
        self, chosen: Tensor, rejected: Tensor, pairs: float
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss and ``loss/*`` metrics of ``(P,)`` mean log-probs of the replies."""
        raise NotImplementedError

    def loss(
        self, batch: TrajectoryBatch, step_counts: dict[str, float]
    ) -> tuple[Tensor, dict[str, Tensor | float]]:
        chosen, rejected = preference_pairs(batch)  # (P,) row indices each
        chunk = self.config.model.logprob_chunk_size
        out = sequence_logprobs(self.policy, **batch.model_inputs(), chunk_size=chunk)
        logps = sequence_logps(out.logprobs, batch.action_mask, "mean")  # (2P,)
        pairs = step_counts["pairs"]
        loss, parts = self.pair_loss(logps[chosen], logps[rejected], pairs)
        metrics = {name.replace("loss/", "train/", 1): v.detach() for name, v in parts.items()}
        metrics["train/logps_chosen"] = logps[chosen].detach().sum() / max(pairs, 1.0)
        metrics["train/logps_rejected"] = logps[rejected].detach().sum() / max(pairs, 1.0)
        loss, moe_metrics = self.moe.add(loss, out, batch, step_counts)
        return loss, {"train/loss": loss.detach(), **metrics, **moe_metrics}


@register_strategy("simpo")
class SimPOStrategy(ReferenceFreePreference):
    """SimPO (module docstring)."""

    default_beta = 2.0

    def pair_loss(self, chosen, rejected, pairs):
        gamma = self.config.algo.simpo_gamma
        return simpo_loss(chosen, rejected, beta=self.beta, gamma=gamma, global_pairs=pairs)


@register_strategy("orpo")
class ORPOStrategy(ReferenceFreePreference):
    """ORPO (module docstring): the chosen reply's per-token NLL is ``-a_w``."""

    default_beta = 0.1

    def pair_loss(self, chosen, rejected, pairs):
        return orpo_loss(chosen, rejected, -chosen, lam=self.beta, global_pairs=pairs)

"""KTO (``kto``): unpaired desirable / undesirable completions against a frozen reference.

Reference: Ethayarajh et al. 2024, eq. 8, as implemented once in :func:`ardea.algo.kto_loss`.

Batch: :func:`ardea.data.collate_labeled`, ``B`` labeled rows then their ``B`` mismatched
rows (each prompt with another sample's completion). Per row the sequence log-prob is
``log pi(y|x) = sum_t m[t] * logprobs[t]`` (``m`` the action mask, next-token aligned). The
policy scores the labeled rows with gradients and the mismatched rows without; the frozen
reference (built once for the run, :mod:`ardea.trainer.scorers`)
scores all ``2B``. The reference point ``z`` (:func:`ardea.algo.kto_kl_estimate`) is the
mean log-ratio on the mismatched rows of the whole optimizer step (every micro-batch, every
rank: summed with the step's counts before the first loss, :meth:`KTOStrategy.step_counts`),
clamped at 0 and detached. TRL estimates it per micro-batch (gathered over devices), so the
two agree for one micro-batch a step; over a step it does not depend on the world size or
``trainer.grad_accum_steps`` and uses every mismatched row of the step. The loss is the sum
over labeled rows divided by the examples of the whole optimizer step; ``algo.beta`` (default 0.1),
``algo.kto_desirable_weight`` and ``algo.kto_undesirable_weight`` (default 1 each; the
KTO paper keeps ``w_D n_D / (w_U n_U)`` between 1 and 4/3).

Metrics (sums over micro-batches give the step value): ``train/loss``, ``train/kto``,
``train/kl`` (the step's ``z``), ``train/rewards_chosen``,
``train/rewards_rejected``, ``train/rewards_margins``, ``train/logps_chosen``,
``train/logps_rejected`` (TRL's ``rewards/chosen`` and so on); held out, ``eval/loss``
and ``eval/rewards_margins``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ardea import data
from ardea.algo import kto_kl_estimate, kto_logratio_sum, kto_loss
from ardea.data import TrajectoryBatch, labeled_rows
from ardea.model import sequence_logprobs
from ardea.trainer.moe_terms import MoETerms
from ardea.trainer.strategies.base import Strategy, register_strategy
from ardea.trainer.strategies.dpo import sequence_logps


@register_strategy("kto")
class KTOStrategy(Strategy):
    """KTO against a frozen reference (module docstring)."""

    sample_kind = "labeled"
    eval_metrics = ("rewards_margins",)

    uses_reference = True

    def __init__(self, policy: nn.Module, config: Any, **kwargs: Any) -> None:
        super().__init__(policy, config, **kwargs)
        algo = config.algo
        self.beta = 0.1 if algo.beta is None else float(algo.beta)
        self.weights = {
            "desirable_weight": algo.kto_desirable_weight,
            "undesirable_weight": algo.kto_undesirable_weight,
        }
        self.moe = MoETerms(policy, algo.moe_aux_loss_coef)

    def collate(self, samples: Sequence[Any]) -> TrajectoryBatch:
        return data.collate_labeled(samples, self.tokenizer.pad_token_id)

    def step_counts(self, micro_batches: list[TrajectoryBatch]) -> dict[str, float]:
        """The step's examples by label, and the reference point's sum and pairs: the
        policy (without gradients) and the reference score every micro-batch's mismatched
        rows here, before the first loss, so that ``z`` is the whole step's (summed over
        ranks with the other counts). Runs one policy and one reference forward per
        micro-batch: every rank the same number (offline batches split evenly)."""
        layouts = [labeled_rows(b) for b in micro_batches]
        labels = torch.cat([desirable for _, _, desirable in layouts])
        desirable = float(labels.sum())
        logratio = sum(
            (self._logratio_sum(b.select(mismatched)) for b, (_, mismatched, _) in zip(micro_batches, layouts)),
            torch.zeros(()),
        )  # fmt: skip
        counts = {
            "examples": float(len(labels)),
            "desirable": desirable,
            "undesirable": float(len(labels)) - desirable,
            "kl_logratio_sum": float(logratio),
            "kl_pairs": float(sum(len(mismatched) for _, mismatched, _ in layouts)),
        }
        if self.moe.active:  # the router's tokens: those of the forwards with gradients
            forwards = [b.select(rows) for b, (rows, _, _) in zip(micro_batches, layouts)]
            counts |= self.moe.step_counts(forwards)
        return counts

    @torch.no_grad()
    def _logratio_sum(self, rows: TrajectoryBatch) -> Tensor:
        """:func:`~ardea.algo.kto_logratio_sum` of mismatched ``rows``."""
        chunk = self.config.model.logprob_chunk_size
        out = sequence_logprobs(self.policy, **rows.model_inputs(), chunk_size=chunk)
        policy = sequence_logps(out.logprobs, rows.action_mask, "sum")
        reference = sequence_logps(self.reference.logprobs(rows), rows.action_mask, "sum")
        return kto_logratio_sum(policy, reference).cpu()

    def loss(
        self, batch: TrajectoryBatch, step_counts: dict[str, float]
    ) -> tuple[Tensor, dict[str, Tensor | float]]:
        rows, _, desirable = labeled_rows(batch)  # (B,) each
        examples = batch.select(rows)
        chunk = self.config.model.logprob_chunk_size
        out = sequence_logprobs(self.policy, **examples.model_inputs(), chunk_size=chunk)
        logps = sequence_logps(out.logprobs, examples.action_mask, "sum")  # (B,)
        ref_logps = sequence_logps(self.reference.logprobs(examples), examples.action_mask, "sum")
        kl = kto_kl_estimate(step_counts["kl_logratio_sum"], step_counts["kl_pairs"])
        loss, parts = kto_loss(
            logps, ref_logps, desirable, kl.to(logps.device), beta=self.beta, **self.weights,
            global_examples=step_counts["examples"],
            global_desirable=step_counts["desirable"],
            global_undesirable=step_counts["undesirable"],
        )  # fmt: skip
        metrics = {name.replace("loss/", "train/", 1): v for name, v in parts.items()}
        # z is the step's: a micro-batch's share of it, so that the sum over them is z
        share = examples.rows / max(step_counts["examples"], 1.0)
        metrics["train/kl"] = kl * share
        loss, moe_metrics = self.moe.add(loss, out, examples, step_counts)
        return loss, {"train/loss": loss.detach(), **metrics, **moe_metrics}

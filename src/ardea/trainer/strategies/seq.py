"""Next-token pretraining (``seq``): cross-entropy on every real token.

``loss = sum_{n,t} m[n,t] * l[n,t] / T_step`` with ``l[n,t] = -log pi(x[n,t+1] | x[n,<=t])``,
or its label-smoothed form (Szegedy et al. 2016) when ``algo.label_smoothing > 0``, and
``T_step`` the number of counted positions in the whole optimizer step (token-mean over the
step, whatever the micro-batching). ``m`` is next-token aligned: position ``t`` counts when
token ``t + 1`` is trained (here: every real token, i.e. the attention mask, or the loss mask
of a packed row) and is not the first token of its document (position id 0: nothing before
it in the document predicts it).

Without label smoothing the loss comes from the chunked log-probs of
:func:`ardea.model.sequence_logprobs` (no full float32 ``[N, S, V]`` logits); with it, the
full logits go through :func:`ardea.algo.masked_cross_entropy`. MoE policies add their
load-balancing loss (:mod:`ardea.trainer.moe_terms`).

Batches (from ``ardea.data``): ``collate_sft`` and ``collate_packed`` give
:class:`~ardea.data.TrajectoryBatch`es; packed rows carry ``position_ids`` (restarting at 0
per document), and the model attends only within each document.
Metrics: ``train/loss`` (plus the MoE metrics).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ardea import data
from ardea.algo import Aggregation, agg_loss, masked_cross_entropy, next_token_align
from ardea.data import TrajectoryBatch, action_positions
from ardea.model import position_ids_from_mask, sequence_logprobs
from ardea.model.logprobs import sequence_logits
from ardea.trainer.moe_terms import MoETerms
from ardea.trainer.strategies.base import Strategy, register_strategy


class NextTokenStrategy(Strategy):
    """Token-mean next-token cross-entropy over the tokens :meth:`trained_tokens` marks."""

    def __init__(self, policy: torch.nn.Module, config: Any, **kwargs: Any) -> None:
        super().__init__(policy, config, **kwargs)
        self.label_smoothing = float(config.algo.label_smoothing)
        self.moe = MoETerms(policy, config.algo.moe_aux_loss_coef)

    @abstractmethod
    def trained_tokens(self, batch: TrajectoryBatch) -> Tensor:
        """Token-aligned ``(N, S)`` bool: tokens the loss is taken on."""

    def collate(self, samples: Sequence[Any]) -> TrajectoryBatch:
        """Packed rows (samples with ``position_ids``) or right-padded sequences."""
        pad = self.tokenizer.pad_token_id
        if samples and getattr(samples[0], "position_ids", None) is not None:
            return data.collate_packed(samples, pad)
        return data.collate_sft(samples, pad)

    def predicted_mask(self, batch: TrajectoryBatch) -> Tensor:
        """Next-token aligned ``(N, S)`` bool: position ``t`` counts when token ``t + 1`` is
        trained and is not the first token of its document."""
        positions = batch.position_ids
        if positions is None:
            positions = position_ids_from_mask(batch.attention_mask)
        return action_positions(self.trained_tokens(batch) & (positions != 0))

    def step_counts(self, micro_batches: list[TrajectoryBatch]) -> dict[str, float]:
        counts = {"tokens": float(sum(self.predicted_mask(b).sum() for b in micro_batches))}
        return counts | self.moe.step_counts(micro_batches)

    def loss(
        self, batch: TrajectoryBatch, step_counts: dict[str, float]
    ) -> tuple[Tensor, dict[str, Tensor | float]]:
        mask = self.predicted_mask(batch)  # (N, S)
        agg = Aggregation("token-mean", step_counts["tokens"])
        inputs = batch.model_inputs()
        if self.label_smoothing > 0:
            out = sequence_logits(self.policy, **inputs)
            loss, _ = masked_cross_entropy(
                out.logits,  # (N, S, V): logits[:, t] predicts token t + 1
                next_token_align(batch.input_ids),
                mask,
                label_smoothing=self.label_smoothing,
                agg=agg,
            )
        else:
            out = sequence_logprobs(
                self.policy, **inputs, chunk_size=self.config.model.logprob_chunk_size
            )
            loss = agg_loss(-out.logprobs, mask, agg)
        loss, metrics = self.moe.add(loss, out, batch, step_counts)
        return loss, {"train/loss": loss.detach(), **metrics}


@register_strategy("seq")
class SeqStrategy(NextTokenStrategy):
    """Pretraining-style next-token prediction on every real token (module docstring)."""

    sample_kind = "text"

    def trained_tokens(self, batch: TrajectoryBatch) -> Tensor:
        if batch.position_ids is not None:  # packed: every document token but the first
            return batch.loss_mask
        return batch.attention_mask.bool()

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
load-balancing loss (:mod:`ardea.trainer.strategies.moe`).

Batches (from ``ardea.data``): ``collate_sft`` gives ``input_ids``, ``attention_mask``,
``loss_mask``; ``collate_packed`` gives ``input_ids``, ``position_ids`` (restarting at 0 per
document) and ``loss_mask``, and no attention mask (documents attend only within themselves).
Metrics: ``train/loss`` (plus the MoE metrics).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ardea import data
from ardea.algo import agg_loss, masked_cross_entropy, next_token_align
from ardea.model import position_ids_from_mask, sequence_logprobs
from ardea.model.logprobs import sequence_logits
from ardea.trainer.strategies.base import Strategy, register_strategy
from ardea.trainer.strategies.moe import MoETerms


class NextTokenStrategy(Strategy):
    """Token-mean next-token cross-entropy over the tokens :meth:`trained_tokens` marks."""

    def __init__(self, policy: torch.nn.Module, config: Any, **kwargs: Any) -> None:
        super().__init__(policy, config, **kwargs)
        self.label_smoothing = float(config.algo.label_smoothing)
        self.moe = MoETerms(policy, config.algo.moe_aux_loss_coef)

    @abstractmethod
    def trained_tokens(self, batch: dict[str, Tensor]) -> Tensor:
        """Token-aligned ``(N, S)`` 0/1: tokens the loss is taken on."""

    def collate(self, samples: Sequence[Any]) -> dict[str, Tensor]:
        """Packed rows (samples with ``position_ids``) or right-padded sequences."""
        pad = self.tokenizer.pad_token_id
        if samples and getattr(samples[0], "position_ids", None) is not None:
            return data.collate_packed(samples, pad)
        return data.collate_sft(samples, pad)

    def predicted_mask(self, batch: dict[str, Tensor]) -> Tensor:
        """Next-token aligned ``(N, S)`` bool: position ``t`` counts when token ``t + 1`` is
        trained and is not the first token of its document."""
        positions = batch.get("position_ids")
        if positions is None:
            positions = position_ids_from_mask(batch["attention_mask"])
        tokens = self.trained_tokens(batch).bool() & (positions != 0)  # (N, S) token-aligned
        return next_token_align(tokens, False)

    def step_counts(self, micro_batches: list[dict[str, Tensor]]) -> dict[str, float]:
        counts = {"tokens": float(sum(self.predicted_mask(b).sum() for b in micro_batches))}
        forwards = [(b["input_ids"], b.get("attention_mask")) for b in micro_batches]
        return counts | self.moe.step_counts(forwards)

    def loss(
        self, batch: dict[str, Tensor], step_counts: dict[str, float]
    ) -> tuple[Tensor, dict[str, float]]:
        mask = self.predicted_mask(batch)  # (N, S)
        inputs = dict(
            input_ids=batch["input_ids"],
            attention_mask=batch.get("attention_mask"),
            position_ids=batch.get("position_ids"),
        )
        if self.label_smoothing > 0:
            out = sequence_logits(self.policy, **inputs)
            loss, _ = masked_cross_entropy(
                out.logits,  # (N, S, V): logits[:, t] predicts token t + 1
                next_token_align(batch["input_ids"]),
                mask,
                label_smoothing=self.label_smoothing,
                global_tokens=step_counts["tokens"],
            )
        else:
            out = sequence_logprobs(
                self.policy, **inputs, chunk_size=self.config.model.logprob_chunk_size
            )
            loss = agg_loss(-out.logprobs, mask, "token-mean", global_tokens=step_counts["tokens"])
        loss, metrics = self.moe.add(
            loss,
            out,
            input_ids=batch["input_ids"],
            attention_mask=inputs["attention_mask"],
            step_counts=step_counts,
        )
        return loss, {"train/loss": float(loss.detach()), **metrics}


@register_strategy("seq")
class SeqStrategy(NextTokenStrategy):
    """Pretraining-style next-token prediction on every real token (module docstring)."""

    sample_kind = "text"

    def trained_tokens(self, batch: dict[str, Tensor]) -> Tensor:
        mask = batch.get("attention_mask")
        return batch["loss_mask"] if mask is None else mask

"""Supervised fine-tuning (``sft``): next-token cross-entropy on answer tokens only.

``loss = -sum_{n,t} m[n,t] * log pi(x[n,t+1] | x[n,<=t]) / T_step`` (label-smoothed when
``algo.label_smoothing > 0``) where ``m`` is the batch's ``loss_mask`` (1 on answer tokens)
aligned to next-token positions, and ``T_step`` the number of answer tokens in the whole
optimizer step (token-mean over the step, independent of how the step is split into
micro-batches). Everything else -- packed rows, label smoothing, the MoE terms -- is shared
with ``seq`` (:class:`ardea.trainer.strategies.seq.NextTokenStrategy`).

Packing: a packed row's ``position_ids`` restart at 0 per document and the model attends only
within each document, so a packed batch gives the same loss as the same documents unpacked.
"""

from __future__ import annotations

from torch import Tensor

from ardea.data import TrajectoryBatch
from ardea.trainer.strategies.base import register_strategy
from ardea.trainer.strategies.seq import NextTokenStrategy


@register_strategy("sft")
class SFTStrategy(NextTokenStrategy):
    """Cross-entropy on the tokens of ``loss_mask`` (the answers)."""

    sample_kind = "sft"

    def trained_tokens(self, batch: TrajectoryBatch) -> Tensor:
        return batch.loss_mask

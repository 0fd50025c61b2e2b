"""One way to score a batch's tokens with a frozen model: the reference of a KL term or a
DPO loss, and a distillation teacher.

``TokenScorer(model, chunk_size).logprobs(batch)`` is the ``(N, S)`` next-token log-probs
``out[:, t] = log p(input_ids[:, t + 1] | input_ids[:, :t + 1])`` of the frozen ``model``,
under the distribution the batch was sampled from (its temperature, top-k and top-p; 1, 0,
1 for data files), without gradients. Strategies call it once per training step on the
rows they train on: online strategies pin the result on the rollout before the step's
updates (every epoch and mini-batch reuses it), offline ones (one update per step) score
each micro-batch once. ``rows_scored`` counts the rows it has scored, so that a test can
check the once per step.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ardea.data import TrajectoryBatch
from ardea.model import LogprobOutput, sequence_logprobs


class TokenScorer:
    """Per-token log-probs of a frozen ``model`` (module docstring).

    Args:
        model: the frozen model (eval mode, no gradients), wrapped for data parallelism as
            the policy is.
        chunk_size: token positions per LM-head chunk (``model.logprob_chunk_size``).
    """

    def __init__(self, model: nn.Module, chunk_size: int) -> None:
        self.model = model
        self.chunk_size = chunk_size
        self.rows_scored = 0

    @torch.no_grad()
    def logprobs(self, batch: TrajectoryBatch) -> Tensor:
        """``(N, S)`` float32 next-token log-probs of ``batch`` at its sampling distribution."""
        return self.scores(batch).logprobs

    @torch.no_grad()
    def scores(self, batch: TrajectoryBatch, top: int = 0) -> LogprobOutput:
        """:meth:`logprobs` with, for ``top > 0``, every position's ``top`` most likely next
        tokens and their log-probs (``top_ids``, ``top_logprobs``, ``(N, S, top)``, at the
        batch's temperature without truncation), in the same forward."""
        self.rows_scored += batch.rows
        return sequence_logprobs(
            self.model, **batch.model_inputs(), chunk_size=self.chunk_size,
            top_logprobs=top, **batch.sampling(),
        )  # fmt: skip

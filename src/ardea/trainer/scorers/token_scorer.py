"""One way to score a batch's tokens with a frozen model: the reference of a KL term or a
DPO loss, and a distillation teacher.

``TokenScorer(model, chunk_size).logprobs(batch)`` is the ``(N, S)`` next-token log-probs
``out[:, t] = log p(input_ids[:, t + 1] | input_ids[:, :t + 1])`` of the frozen ``model``,
under the distribution the batch was sampled from (its temperature, top-k and top-p; 1, 0,
1 for data files), without gradients. Strategies call it once per training step on the
rows they train on: online strategies pin the result on the rollout before the step's
updates (every epoch and mini-batch reuses it), offline ones (one update per step) score
each micro-batch once. ``rows_scored`` counts the rows it has scored, so that a test can
check the once per step. :class:`ServedTokenScorer` gives the same scores from a model a
vLLM server serves (a distillation teacher with ``algo.teacher.engine: vllm``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ardea.data import TrajectoryBatch
from ardea.model import LogprobOutput, sequence_logprobs
from ardea.rollout.engines.vllm.scoring import VLLMPromptScorer
from ardea.rollout.engines.vllm.server import LaunchedServer


class TokenScorer:
    """Per-token log-probs of a frozen ``model`` (module docstring).

    Args:
        model: the frozen model (eval mode, no gradients), wrapped for data parallelism as
            the policy is.
        chunk_size: token positions per LM-head chunk (``model.logprob_chunk_size``).
        replays_routing: forwards of rows carrying ``routed_experts`` replay them (a
            reference of the policy's own architecture); False for another model (a teacher).
    """

    def __init__(self, model: nn.Module, chunk_size: int, *, replays_routing: bool = True) -> None:
        self.model = model
        self.chunk_size = chunk_size
        self.replays_routing = replays_routing
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
        inputs = batch.model_inputs()
        if not self.replays_routing:
            inputs.pop("routed_experts", None)
        return sequence_logprobs(
            self.model, **inputs, chunk_size=self.chunk_size, top_logprobs=top,
            **batch.sampling(),
        )  # fmt: skip

    def close(self) -> None:
        """Nothing to release: the model is the caller's."""


class ServedTokenScorer:
    """:class:`TokenScorer`'s ``scores`` from a model a vLLM server serves (its prompt
    log-probs, :mod:`ardea.rollout.engines.vllm.scoring`): at temperature 1 without truncation, so
    only for batches sampled that way (the caller checks). Rows are right-padded, not packed.

    Args:
        scorer: the server's scorer.
        server: a server ardea launched for it (stopped by :meth:`close`), or None.
    """

    def __init__(self, scorer: VLLMPromptScorer, server: LaunchedServer | None = None) -> None:
        self.scorer = scorer
        self.server = server
        self.rows_scored = 0

    def logprobs(self, batch: TrajectoryBatch) -> Tensor:
        return self.scores(batch).logprobs

    def scores(self, batch: TrajectoryBatch, top: int = 0) -> LogprobOutput:
        """``(N, S)`` next-token log-probs (0 past each row's last real token) and, for
        ``top > 0``, ``(N, S, top)`` top tokens and log-probs, on the batch's device."""
        self.rows_scored += batch.rows
        lengths = batch.attention_mask.sum(dim=-1).tolist()
        rows = [ids[:n] for ids, n in zip(batch.input_ids.tolist(), lengths)]
        answers = self.scorer.score(rows, top)
        n, s = batch.input_ids.shape
        logprobs = torch.zeros(n, s)
        top_ids = torch.zeros(n, s, top, dtype=torch.long) if top else None
        top_logprobs = torch.zeros(n, s, top) if top else None
        for i, answer in enumerate(answers):
            width = len(answer.logprobs)
            logprobs[i, :width] = torch.tensor(answer.logprobs)
            if top:
                top_ids[i, :width] = torch.tensor(answer.top_ids, dtype=torch.long)
                top_logprobs[i, :width] = torch.tensor(answer.top_logprobs)
        device = batch.input_ids.device
        return LogprobOutput(
            logprobs=logprobs.to(device),
            top_ids=None if top_ids is None else top_ids.to(device),
            top_logprobs=None if top_logprobs is None else top_logprobs.to(device),
        )

    def close(self) -> None:
        """Stop the server ardea launched, if any."""
        if self.server is not None:
            self.server.stop()

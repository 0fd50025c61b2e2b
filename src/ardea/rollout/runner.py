"""The rollout runner: G completions per prompt from the live policy, scored, as one batch.

One call turns task examples into a trajectory batch in the group layout of
:func:`ardea.data.collate_groups` (one right-padded ``[N, S]`` row per completion,
``N = B·G``) plus the policy bookkeeping of DESIGN.md's trajectory layout:

- ``logprobs`` [N, S]: behaviour log-probs from the engine, token-aligned;
- ``versions`` [N, S]: the policy version that generated each completion token (−1 elsewhere);
- ``no_eos`` [N]: True where the completion hit ``max_new_tokens`` without a stop token;
- ``rewards`` [N], ``group_ids`` [N].

A batch is only handed on while ``current_version − min(versions) ≤ max_staleness``;
a batch from a future version or beyond the bound raises :class:`StalenessError` and is
never used.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import torch

from ardea.data import Example, GroupSample, collate_groups, encode_prompt
from ardea.errors import ArdeaError
from ardea.reward import RewardScorer, example_row
from ardea.rollout.engine import GenerationEngine, SamplingParams

SAMPLES_KEPT = 4  # prompts per rollout whose first completion is kept for samples.jsonl


class StalenessError(ArdeaError):
    """A rollout is older than the staleness bound, or claims a future policy version."""


def check_staleness(versions: torch.Tensor, current: int, max_staleness: int) -> int:
    """The batch's staleness ``current − min(version)`` over generated tokens; raises
    :class:`StalenessError` when it exceeds ``max_staleness`` or is negative."""
    generated = versions[versions >= 0]
    if generated.numel() == 0:
        return 0
    oldest, newest = int(generated.min()), int(generated.max())
    if newest > current:
        raise StalenessError(
            f"rollout from policy version {newest} but the live policy is {current}"
        )
    lag = current - oldest
    if lag > max_staleness:
        raise StalenessError(
            f"rollout from policy version {oldest} is {lag} versions behind the live policy "
            f"{current}; rollout.max_staleness={max_staleness}"
        )
    return lag


class RolloutRunner:
    """Samples ``group_size`` completions per example and scores them."""

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Any,
        scorer: RewardScorer,
        *,
        group_size: int,
        params: SamplingParams,
        chat_template: bool = False,
        seed: int = 0,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.scorer = scorer
        self.group_size = group_size
        self.params = params
        self.chat_template = chat_template
        self.seed = seed
        self.calls = 0
        self.last_metrics: dict[str, float] = {}
        self.last_samples: list[tuple[str, str, float]] = []

    def rollout(self, examples: Sequence[Example]) -> dict[str, torch.Tensor]:
        """Generate, score and collate; metrics of the call go to ``last_metrics``."""
        start = time.perf_counter()
        prompts = [
            encode_prompt(self.tokenizer, e.prompt, chat_template=self.chat_template)
            for e in examples
        ]
        params = dataclasses.replace(
            self.params, n=self.group_size, seed=self.seed * 1_000_003 + self.calls
        )
        self.calls += 1
        completions = self.engine.generate(prompts, params)
        generated = time.perf_counter()
        texts = [self.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
        groups = [e for e in examples for _ in range(self.group_size)]
        scored = self.scorer.score(
            [e.prompt for e in groups], texts, [example_row(e) for e in groups]
        )
        scored_at = time.perf_counter()
        batch = self._collate(prompts, completions, scored.rewards)
        self.last_samples = [  # the first completion of the first few prompts, for samples.jsonl
            (groups[i].prompt, texts[i], scored.rewards[i])
            for i in range(0, min(len(groups), SAMPLES_KEPT * self.group_size), self.group_size)
        ]
        lengths = [len(c.token_ids) for c in completions]
        rewards = torch.tensor(scored.rewards)
        self.last_metrics = {
            "rollout/reward_mean": float(rewards.mean()),
            "rollout/reward_std": float(rewards.std(unbiased=False)),
            "rollout/response_length": sum(lengths) / len(lengths),
            "rollout/truncated_fraction": float(batch["no_eos"].float().mean()),
            "perf/generate_tokens_per_s": sum(lengths) / max(generated - start, 1e-9),
            "perf/time_generate": generated - start,
            "perf/time_score": scored_at - generated,
            **{f"{k}": float(v) for k, v in scored.counts.items()},
        }
        return batch

    def _collate(self, prompts, completions, rewards) -> dict[str, torch.Tensor]:
        g = self.group_size
        samples = [
            GroupSample(
                tuple(prompt),
                tuple(tuple(c.token_ids) for c in completions[i * g : (i + 1) * g]),
                tuple(rewards[i * g : (i + 1) * g]),
                tuple(tuple(c.logprobs) for c in completions[i * g : (i + 1) * g]),
            )
            for i, prompt in enumerate(prompts)
        ]
        batch = collate_groups(samples, self.tokenizer.pad_token_id)
        version = torch.tensor([c.version for c in completions])  # (N,)
        batch["versions"] = torch.where(batch["loss_mask"] > 0, version[:, None], -1)  # (N, S)
        batch["no_eos"] = torch.tensor([c.finish_reason == "length" for c in completions])
        return batch

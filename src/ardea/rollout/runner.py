"""The rollout runner: G completions per prompt from the live policy, scored, as one batch.

One call turns rollout prompts (task examples or prompt records, :mod:`ardea.data.prompt_data`)
into a trajectory batch in the group layout of
:func:`ardea.data.collate_groups` (one right-padded ``[N, S]`` row per completion,
``N = B·G``) plus the policy bookkeeping of DESIGN.md's trajectory layout:

- ``logprobs`` [N, S]: behaviour log-probs from the engine, token-aligned;
- ``versions`` [N, S]: the policy version that generated each completion token (−1 elsewhere);
- ``turn_ids`` [N, S]: 0 on completion tokens (a single assistant turn), −1 elsewhere;
- ``no_eos`` [N]: True where the completion hit ``max_new_tokens`` without a stop token;
- ``rewards`` [N] (the scorer's weighted sum plus the overlong penalty), ``group_ids`` [N].

A batch is only handed on while ``current_version − min(versions) ≤ max_staleness``
(:func:`check_staleness`): a batch from a future version or beyond the bound raises
:class:`StalenessError` and is never used.

Randomness: call ``rollout(examples, seed_index=i)`` samples with the engine seed
``sampling_seed(runner seed, i)``, so the same index gives the same completions whichever
thread or process makes the call and however many calls came before.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import time
from collections.abc import Sequence
from typing import Any

import torch

from ardea.data import GroupSample, RolloutPrompt, Task, collate_groups, rollout_prompt_ids
from ardea.errors import ArdeaError
from ardea.reward import RewardScorer, example_row, overlong_penalty
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


def sampling_seed(seed: int, *indices: int) -> int:
    """A 63-bit engine seed from the run seed and call indices (a stable hash)."""
    key = ":".join(str(int(i)) for i in (seed, *indices)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 1


@dataclasses.dataclass
class Rollout:
    """One scored rollout: the trajectory ``batch`` (CPU tensors, module docstring), its
    ``metrics`` (``rollout/*``, ``reward/*``, ``perf/*``) and a few ``samples``
    ``(prompt, completion, reward)`` for ``samples.jsonl``."""

    batch: dict[str, torch.Tensor]
    metrics: dict[str, float]
    samples: list[tuple[str, str, float]]


class RolloutRunner:
    """Samples ``group_size`` completions per example and scores them.

    Args:
        engine: the generation engine (its version labels the tokens).
        tokenizer: encodes prompts, decodes completions for the reward functions.
        scorer: the reward functions.
        group_size: G completions per prompt.
        params: sampling parameters (``n`` and ``seed`` are set per call).
        chat_template: wrap prompts in the tokenizer's chat template.
        seed: the run seed (see the module docstring).
        task: when given, ``rollout/accuracy`` is the share of completions its verifier
            accepts, whatever the reward functions are (the prompts must then be its
            examples).
        overlong_buffer, overlong_penalty: DAPO's soft overlong penalty
            (:func:`ardea.reward.overlong_penalty`; buffer 0 = off).
    """

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
        task: Task | None = None,
        overlong_buffer: int = 0,
        overlong_penalty: float = 1.0,
    ) -> None:
        if overlong_buffer > params.max_new_tokens:
            raise ValueError(
                f"reward.overlong_buffer={overlong_buffer} exceeds rollout.max_new_tokens="
                f"{params.max_new_tokens}"
            )
        self.engine = engine
        self.tokenizer = tokenizer
        self.scorer = scorer
        self.group_size = group_size
        self.params = params
        self.chat_template = chat_template
        self.seed = seed
        self.task = task
        self.overlong_buffer = overlong_buffer
        self.overlong_penalty = overlong_penalty

    def detached_copy(self) -> RolloutRunner:
        """The same runner on a copy of the engine with its own weights
        (``engine.detached_copy()``), for generating in a background thread."""
        copy_engine = getattr(self.engine, "detached_copy", None)
        if copy_engine is None:
            raise TypeError(
                f"{type(self.engine).__name__} cannot make a detached copy of its weights, "
                "which background rollouts (rollout.max_staleness > 0) need"
            )
        other = copy.copy(self)
        other.engine = copy_engine()
        return other

    def rollout(
        self, examples: Sequence[RolloutPrompt], *, seed_index: Sequence[int] | int
    ) -> Rollout:
        """Generate, score and collate G completions for each of ``examples``."""
        start = time.perf_counter()
        prompts = [
            rollout_prompt_ids(self.tokenizer, e, chat_template=self.chat_template)
            for e in examples
        ]
        indices = (seed_index,) if isinstance(seed_index, int) else tuple(seed_index)
        params = dataclasses.replace(
            self.params, n=self.group_size, seed=sampling_seed(self.seed, *indices)
        )
        completions = self.engine.generate(prompts, params)
        generated = time.perf_counter()
        texts = [self.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
        groups = [e for e in examples for _ in range(self.group_size)]
        scored = self.scorer.score(
            [e.prompt for e in groups], texts, [example_row(e) for e in groups]
        )
        lengths = [len(c.token_ids) for c in completions]
        penalties = overlong_penalty(
            lengths,
            max_length=self.params.max_new_tokens,
            buffer=self.overlong_buffer,
            penalty=self.overlong_penalty,
        )
        rewards = [r + p for r, p in zip(scored.rewards, penalties)]
        metrics = self._metrics(rewards, lengths, completions, texts, groups)
        if self.overlong_buffer:
            metrics["rollout/overlong_penalty"] = sum(penalties) / len(penalties)
        metrics.update({k: float(v) for k, v in scored.counts.items()})
        scored_at = time.perf_counter()
        batch = self._collate(prompts, completions, rewards)
        samples = [  # the first completion of the first few prompts, for samples.jsonl
            (groups[i].prompt, texts[i], rewards[i])
            for i in range(0, min(len(groups), SAMPLES_KEPT * self.group_size), self.group_size)
        ]
        metrics |= {
            "perf/generate_tokens_per_s": sum(lengths) / max(generated - start, 1e-9),
            "perf/time_generate": generated - start,
            "perf/time_score": scored_at - generated,
        }
        return Rollout(batch, metrics, samples)

    def _metrics(self, rewards, lengths, completions, texts, groups) -> dict[str, float]:
        values = torch.tensor(rewards, dtype=torch.float64)
        metrics = {
            "rollout/reward_mean": float(values.mean()),
            "rollout/reward_std": float(values.std(unbiased=False)),
            "rollout/response_length": sum(lengths) / len(lengths),
            "rollout/truncated_fraction": sum(c.finish_reason == "length" for c in completions)
            / len(completions),
        }
        if self.task is not None:
            correct = [self.task.score(t, e) > 0 for t, e in zip(texts, groups)]
            metrics["rollout/accuracy"] = sum(correct) / len(correct)
        return metrics

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
        generated = batch["loss_mask"] > 0  # (N, S)
        version = torch.tensor([c.version for c in completions])  # (N,)
        batch["versions"] = torch.where(generated, version[:, None], -1)  # (N, S)
        batch["turn_ids"] = torch.where(generated, 0, -1)  # (N, S): one assistant turn
        batch["no_eos"] = torch.tensor([c.finish_reason == "length" for c in completions])
        return batch

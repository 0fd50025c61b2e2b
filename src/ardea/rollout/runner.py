"""The rollout runner: G completions per prompt from a generation engine, then scored.

A rollout of rollout prompts (task examples or prompt records, :mod:`ardea.data.prompt_data`)
is two calls, so that the training step can time and place them separately:

- :meth:`RolloutRunner.generate`: the engine completes every prompt ``group_size`` times
  (a :class:`Generation`: completions with behaviour log-probs and policy versions);
- :meth:`RolloutRunner.score`: the reward functions (plus DAPO's overlong penalty) score
  the completions, and they become one :class:`~ardea.data.TrajectoryBatch` (a prompt
  segment and a generated segment per row, ``N = B·G`` rows, ``group_ids`` the prompt's
  index in the call, ``no_eos`` where the length limit ended a completion, the sampling
  temperature of the behaviour log-probs) with ``rollout/*``, ``reward/*`` metrics and a
  few samples for ``samples.jsonl``.

A batch is only handed on while ``current_version − min(versions) ≤ max_staleness``
(:func:`check_staleness`): a batch from a future version or beyond the bound raises
:class:`StalenessError` and is never used.

Randomness: ``generate(examples, seed_index=i)`` samples with the engine seed
``sampling_seed(runner seed, i)``, so the same index gives the same completions whichever
thread or process makes the call and however many calls came before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Sequence
from typing import Any

import torch

from ardea.data import RolloutPrompt, Segment, Task, Trajectory, TrajectoryBatch, rollout_prompt_ids
from ardea.errors import ArdeaError, ConfigError
from ardea.reward import (
    RewardError,
    RewardScorer,
    ScoreResult,
    TokenIds,
    example_row,
    failure_metrics,
    overlong_penalty,
    vocab_id,
)
from ardea.rollout.checks import check_routed
from ardea.rollout.engine import Completion, GenerationEngine, SamplingParams

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
class Generation:
    """The completions of one rollout call, before scoring: the task ``examples``, their
    ``prompts`` (token ids), ``completions`` (``group_size`` per prompt, prompt-major), the
    ``seconds`` generation took, and ``tail_seconds``: from when 90 % of the completions
    were done to when the last one was (the wait on the slowest tenth; 0 for an engine
    that does not time its completions), and ``scored``: the reward functions' scores when
    they were computed where the completions were made (``generate(score=True)``, in a
    background worker), else None."""

    examples: list[RolloutPrompt]
    prompts: list[list[int]]
    completions: list[Completion]
    seconds: float
    tail_seconds: float = 0.0
    scored: ScoreResult | None = None


@dataclasses.dataclass
class Rollout:
    """One scored rollout: the trajectory ``batch``, its ``metrics`` (``rollout/*``,
    ``reward/*``, ``perf/*``) and a few ``samples`` ``(prompt, completion, reward)`` for
    ``samples.jsonl``."""

    batch: TrajectoryBatch
    metrics: dict[str, float]
    samples: list[tuple[str, str, float]]


def tail_seconds(done: list[float]) -> float:
    """Seconds from the time 90 % of ``done`` (completions' seconds from submission to
    their end, submitted together) had passed to the last one."""
    if not done:
        return 0.0
    times = sorted(done)
    return times[-1] - times[math.ceil(0.9 * len(times)) - 1]


def _first_of_groups(rows: list[int], group_size: int) -> list[int]:
    """The first of ``rows`` (ascending indices) of each group of ``group_size``."""
    first: dict[int, int] = {}
    for i in rows:
        first.setdefault(i // group_size, i)
    return list(first.values())


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
        overlong_buffer: DAPO's soft overlong penalty's buffer
            (:func:`ardea.reward.overlong_penalty`; 0 = off).
        overlong_penalty: that penalty's maximum.
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
        self._vocab: str | None = None  # vocab_id(tokenizer), read when first scoring ids

    def encode(self, examples: Sequence[RolloutPrompt]) -> list[list[int]]:
        """The prompt token ids of ``examples`` (task examples or prompt records)."""
        return [
            rollout_prompt_ids(self.tokenizer, e, chat_template=self.chat_template)
            for e in examples
        ]

    def generate(
        self,
        examples: Sequence[RolloutPrompt],
        *,
        seed_index: Sequence[int] | int,
        engine: GenerationEngine | None = None,
        first_prompt: int = 0,
        score: bool = False,
    ) -> Generation:
        """``group_size`` completions of each example from ``engine`` (default: the runner's).
        ``first_prompt``: the index of ``examples[0]`` in a rollout split over processes (its
        completions are those the whole rollout's call would sample). ``score``: run the
        reward functions now, in this thread (a background worker asks for it, so that
        scoring leaves the step's critical path), rather than in :meth:`score`."""
        start = time.perf_counter()
        prompts = self.encode(examples)
        indices = (seed_index,) if isinstance(seed_index, int) else tuple(seed_index)
        params = dataclasses.replace(
            self.params,
            n=self.group_size,
            seed=sampling_seed(self.seed, *indices),
            row_ids=[
                first_prompt * self.group_size + r for r in range(len(prompts) * self.group_size)
            ],
        )
        completions = (engine or self.engine).generate(prompts, params)
        check_routed(params, completions, engine or self.engine)
        tail = tail_seconds([c.seconds for c in completions if c.seconds is not None])
        seconds = time.perf_counter() - start
        generation = Generation(list(examples), prompts, completions, seconds, tail)
        if score:
            try:
                generation.scored = self._score_texts(generation, self._texts(generation))
            except RewardError:  # on_error=fail: left for score(), which tries again and
                pass  # raises on the trainer's step; a checkpoint can still hold these
        return generation

    def score_rewards(self, generation: Generation) -> None:
        """Run the reward functions on ``generation`` now, unless they already have
        (``generation.scored``): a rollout split over the processes of a torchrun job
        scores each share where it was generated, then :meth:`join` s the shares."""
        if generation.scored is None:
            generation.scored = self._score_texts(generation, self._texts(generation))

    @staticmethod
    def join(parts: Sequence[Generation]) -> Generation:
        """One generation of ``parts``, the consecutive shares of a rollout generated side by
        side (each with ``first_prompt`` at its place): its completions in order, the
        slowest share's ``seconds`` and tail, and the shares' scores joined (None when a
        share has none: :meth:`score` scores them all)."""
        if len(parts) == 1:
            return parts[0]
        scores = [p.scored for p in parts]
        return Generation(
            [e for p in parts for e in p.examples],
            [ids for p in parts for ids in p.prompts],
            [c for p in parts for c in p.completions],
            max(p.seconds for p in parts),
            max(p.tail_seconds for p in parts),
            None if None in scores else ScoreResult.join(scores),
        )

    def _texts(self, generation: Generation) -> list[str]:
        """The completions decoded for the reward functions."""
        decode = self.tokenizer.decode
        return [decode(c.token_ids, skip_special_tokens=True) for c in generation.completions]

    def _score_texts(self, generation: Generation, texts: list[str]) -> ScoreResult:
        """The reward functions' scores of ``texts``, the completions of ``generation``;
        the functions that ask for token ids get the prompt's and completion's ids as the
        engine was given and sampled them."""
        groups = [e for e in generation.examples for _ in range(self.group_size)]
        token_ids = None
        if any(self.scorer.takes_ids):
            if self._vocab is None:
                self._vocab = vocab_id(self.tokenizer)
            completions = generation.completions
            token_ids = TokenIds(
                [c.prompt_ids for c in completions], [c.token_ids for c in completions], self._vocab
            )
        return self.scorer.score(
            [e.prompt for e in groups], texts, [example_row(e) for e in groups], token_ids=token_ids
        )

    def score(self, generation: Generation) -> Rollout:
        """Score ``generation`` and collate it into a trajectory batch (module docstring):
        under ``reward.on_error=mask`` the completions whose reward failed are left out of
        the batch (so out of their group's baseline and the loss) and of the reward
        metrics. Scores computed by ``generate(score=True)`` are used as they are."""
        completions = generation.completions
        texts = self._texts(generation)
        groups = [e for e in generation.examples for _ in range(self.group_size)]
        scored = generation.scored or self._score_texts(generation, texts)
        lengths = [len(c.token_ids) for c in completions]
        penalties = overlong_penalty(
            lengths,
            max_length=self.params.max_new_tokens,
            buffer=self.overlong_buffer,
            penalty=self.overlong_penalty,
        )
        rewards = [r + p for r, p in zip(scored.rewards, penalties)]
        keep = self._kept(scored)
        metrics = self._metrics(
            [rewards[i] for i in keep], [lengths[i] for i in keep], [completions[i] for i in keep],
            [texts[i] for i in keep], [groups[i] for i in keep],
            {name: [v[i] for i in keep] for name, v in scored.per_function.items()},
        )  # fmt: skip
        if self.overlong_buffer:
            metrics["rollout/overlong_penalty"] = sum(penalties) / len(penalties)
        metrics.update({k: float(v) for k, v in scored.counts.items()})
        metrics |= failure_metrics(scored)
        batch = self._collate(completions, rewards, keep)
        samples = [  # the first kept completion of the first few prompts, for samples.jsonl
            (groups[i].prompt, texts[i], rewards[i])
            for i in _first_of_groups(keep, self.group_size)
        ][:SAMPLES_KEPT]
        # the engine's throughput, wherever it ran (in a background worker too)
        metrics["perf/generate_tokens_per_s"] = sum(lengths) / max(generation.seconds, 1e-9)
        metrics["perf/generate_tail_s"] = generation.tail_seconds
        metrics["perf/reward_s"] = scored.seconds  # wherever the functions ran
        return Rollout(batch, metrics, samples)

    def _kept(self, scored: ScoreResult) -> list[int]:
        """The completions trained: all, or under ``on_error=mask`` those whose reward did
        not fail (none left: a RewardError naming the failing functions)."""
        if self.scorer.on_error != "mask":
            return list(range(len(scored.failed)))
        keep = [i for i, failed in enumerate(scored.failed) if not failed]
        if not keep:
            raise RewardError(
                f"the reward of every completion of the rollout failed (first: reward function "
                f"{scored.first_problem}); under reward.on_error=mask nothing is left to train "
                "on: fix the function or its service"
            )
        return keep

    def generation_state(self, generation: Generation) -> dict[str, Any]:
        """A generation as plain lists (checkpoints load with ``weights_only=True``); its
        examples are the sampler's and are not stored. Its scores are kept: a resumed run
        trains on the rewards the uninterrupted one would have (a judge need not answer
        twice alike)."""
        scored = generation.scored
        return {
            "prompts": generation.prompts,
            "seconds": generation.seconds,
            "tail_seconds": generation.tail_seconds,
            "completions": [dataclasses.asdict(c) for c in generation.completions],
            "scored": None if scored is None else dataclasses.asdict(scored),
        }

    def restore_generation(self, state: dict[str, Any], examples: list[Any]) -> Generation:
        """A stored generation with the examples the sampler gives its step again."""
        encoded = self.encode(examples)
        if encoded != state["prompts"]:
            raise ConfigError(
                "the checkpoint's pending rollouts were made for other prompts than this run's "
                "data gives those steps; resume with the data and config of the run that wrote it"
            )
        completions = [Completion(**c) for c in state["completions"]]
        seconds, tail = float(state["seconds"]), float(state.get("tail_seconds", 0.0))
        scored = state.get("scored")
        scored = None if scored is None else ScoreResult(**scored)
        return Generation(list(examples), encoded, completions, seconds, tail, scored)

    def close(self) -> None:
        """Nothing held between calls."""

    def _metrics(self, rewards, lengths, completions, texts, groups, per_function) -> dict:
        values = torch.tensor(rewards, dtype=torch.float64)
        metrics = {
            "rollout/reward_mean": float(values.mean()),
            "rollout/reward_std": float(values.std(unbiased=False)),
            "rollout/response_length": sum(lengths) / len(lengths),
            "rollout/truncated_fraction": sum(c.finish_reason == "length" for c in completions)
            / len(completions),
            # completions a weight update reached while they ran (rollout.partial)
            "rollout/resumed_fraction": sum(len(c.spans) > 1 for c in completions)
            / len(completions),
        }
        if self.task is not None:  # the task's own scores when a reward function gave them
            scored = [
                per_function[name]
                for name, (fn, _) in zip(self.scorer.names, self.scorer.functions)
                if getattr(fn, "task", None) is self.task
            ]
            scores = scored[0] if scored else [self.task.score(t, e) for t, e in zip(texts, groups)]
            correct = [score > 0 for score in scores]
            metrics["rollout/accuracy"] = sum(correct) / len(correct)
        return metrics

    def _collate(
        self, completions: Sequence[Completion], rewards, rows: list[int]
    ) -> TrajectoryBatch:
        """One row per completion of ``rows`` (indices): its prompt, then what the engine
        generated; its group the prompt's."""
        trajectories = [
            Trajectory(
                (
                    Segment.prompt(c.prompt_ids),
                    Segment.generated(c.token_ids, c.logprobs, version=c.token_versions),
                ),
                reward=rewards[i],
                group_id=i // self.group_size,
                no_eos=c.finish_reason == "length",
                routed_experts=c.routed_experts,
            )
            for i, c in ((i, completions[i]) for i in rows)
        ]
        return TrajectoryBatch.from_trajectories(
            trajectories,
            pad_token_id=self.tokenizer.pad_token_id,
            **self.params.logprob_sampling,
        )

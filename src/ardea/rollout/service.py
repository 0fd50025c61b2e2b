"""The rollout service: generation owned in one place (DESIGN.md, *Scale-out*).

One :class:`RolloutService` per process. It holds the engine of the live policy and the
policy version, the runner that generates and scores on that engine, the background worker
(``rollout.max_staleness`` η ≥ 1: the scheduling policy that generates ahead, on an engine
with its own copy of the weights) and dynamic sampling's refills.

A step's rollout (:meth:`RolloutService.rollout`) is **split over the ranks** of a torchrun
job: each rank generates and scores its share of the step's prompts on its engine (its own
in the process, or its requests to the servers the ranks share), and every rank joins the
shares into the whole scored rollout (:mod:`ardea.rollout.shares`), token for token what
one process samples. On it dynamic sampling's filter, its refills (split the same way), the
staleness check and the ``rollout/*`` metrics run identically on every rank; each rank then
trains on its share of complete groups (:mod:`ardea.trainer.step.split`). A background
worker runs on every rank too, generating that rank's share of the coming steps.

Weights (:meth:`RolloutService.publish`): each rank's engine (and worker) loads the trained
weights under the next version (one atomic ``update_weights``; on shared servers rank 0
loads them and the others wait for it); ``gather_weights`` gives each rank what its engine
loads (a collective under FSDP2, so every rank calls it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ardea.data import Example, TrajectoryBatch
from ardea.data.sampler import EpochSampler
from ardea.errors import ConfigError
from ardea.rollout import (
    Generation,
    GenerationEngine,
    Rollout,
    RolloutWorker,
    Runner,
    check_staleness,
)
from ardea.rollout.dynamic_sampling import (
    first_groups,
    group_count,
    keep_spread,
    refill_batches,
    renumber_groups,
)
from ardea.rollout.shares import Ranks, RolloutShares
from ardea.timing import PhaseTimer

REFILL_SEED_STREAM = 7  # seed offset of the refill sampler and its rollouts
SAVE_WAIT_SECONDS = 600.0  # longest a checkpoint waits for the rollouts it must hold

Weights = dict[str, torch.Tensor]


class RolloutService:
    """Owns generation for the whole run (module docstring).

    Args:
        config: the run config.
        dist: this process's rank.
        engine: this rank's engine of the live policy (None: nothing generates).
        runner: generates and scores on ``engine`` (online runs), else None.
        samples: the training prompts; ``sampler`` draws them (the worker peeks ahead).
        gather_weights: the policy's weights as this rank's engine loads them; called on
            every rank (a collective under FSDP2).
        make_worker_engine: an engine with its own copy of the live engine's weights at the
            given version, for the background worker.
    """

    def __init__(
        self,
        config: Any,
        *,
        dist: Ranks,
        engine: GenerationEngine | None,
        runner: Runner | None,
        samples: Sequence[Example] = (),
        sampler: EpochSampler | None = None,
        gather_weights: Callable[[], Weights],
        make_worker_engine: Callable[[int], GenerationEngine] | None = None,
    ) -> None:
        self.config = config
        self.dist = dist
        self.engine = engine
        self.runner = runner
        self.samples = samples
        self.sampler = sampler
        self.gather_weights = gather_weights
        self.make_worker_engine = make_worker_engine
        self.shares = RolloutShares(dist)
        self.max_staleness = int(config.rollout.max_staleness)
        self.version = engine.version if engine is not None else 0
        self.worker: RolloutWorker | None = None
        self._restored_worker: dict[str, Any] | None = None
        self.refill_sampler: EpochSampler | None = None
        if config.algo.dynamic_sampling:
            seed = config.trainer.seed * 1_000_003 + REFILL_SEED_STREAM
            self.refill_sampler = EpochSampler(len(samples), config.trainer.batch_size, seed)

    @property
    def owner(self) -> bool:
        """Whether this process has an engine (every rank's, when the run generates)."""
        return self.engine is not None

    # ------------------------------------------------------------------ a step
    def rollout(self, step: int, indices: Sequence[int], timer: PhaseTimer) -> Rollout:
        """The scored rollout of step ``step`` (the prompts at ``indices``): the whole
        batch, on CPU, on every rank, with its ``rollout/*`` metrics and samples."""
        examples = [self.samples[i] for i in indices]
        if self.max_staleness == 0:
            generation = self.shares.generated(self.runner, examples, step, timer)
        else:
            generation = self._from_worker(step, examples, timer)
        with timer.phase("score"):
            rollout = self.runner.score(generation)
        batch, metrics = rollout.batch.to("cpu"), dict(rollout.metrics)
        if self.refill_sampler is not None:
            batch = self._filter_and_refill(step, batch, len(examples), timer, metrics)
        lag = check_staleness(batch.versions, self.version, self.max_staleness)
        metrics["rollout/staleness"] = float(lag)
        return Rollout(batch, metrics, rollout.samples)

    def _from_worker(self, step: int, examples: list[Example], timer: PhaseTimer) -> Any:
        """Step ``step``'s generation from the background worker (every rank's worker its
        share), after handing it this step's and the coming steps' prompts."""
        share = self.shares.share(len(examples))

        def mine() -> Any:
            worker = self._worker(step, examples[share.start : share.stop])
            worker.submit(step, examples[share.start : share.stop])
            ahead = min(self.max_staleness, self.config.trainer.max_steps - step - 1)
            for offset, indices in enumerate(self.sampler.peek(ahead), start=1):
                upcoming = [self.samples[i] for i in indices]
                worker.submit(step + offset, upcoming[share.start : share.stop])
            with timer.phase("generate"):
                part = worker.result(step)
            with timer.phase("score"):
                self.runner.score_rewards(part)
            return part

        return self.shares.joined(self.runner, mine, examples, timer)

    def _filter_and_refill(
        self,
        step: int,
        batch: TrajectoryBatch,
        wanted: int,
        timer: PhaseTimer,
        metrics: dict[str, float],
    ) -> TrajectoryBatch:
        """Dynamic sampling: keep groups with a reward spread, refill from fresh prompts
        (:mod:`ardea.rollout.dynamic_sampling`)."""
        algo, size = self.config.algo, self.config.trainer.batch_size
        with timer.phase("filter"):
            parts = [keep_spread(batch)]
        have, generated = group_count(parts[0]), group_count(batch)
        metrics["rollout/groups_kept"] = have / generated
        next_group, rounds = int(batch.group_ids.max()) + 1, 0
        while have < wanted and rounds < algo.dynamic_sampling_max_rounds:
            rounds += 1
            batches = refill_batches(
                wanted - have, kept=have, generated=generated, batch_size=size,
                cap=algo.dynamic_sampling_max_refill,
            )  # fmt: skip
            examples = [
                self.samples[i] for _ in range(batches) for i in self.refill_sampler.next_batch()
            ]
            generated += len(examples)
            seed_index = (step, REFILL_SEED_STREAM, rounds)
            generation = self.shares.generated(self.runner, examples, seed_index, timer)
            with timer.phase("score"):
                refill = self.runner.score(generation).batch.to("cpu")
            with timer.phase("filter"):
                refill = renumber_groups(refill, next_group)
                next_group = int(refill.group_ids.max()) + 1
                parts.append(keep_spread(refill))
                have += group_count(parts[-1])
        metrics["rollout/refill_rounds"] = float(rounds)
        with timer.phase("filter"):
            pad = self.runner.tokenizer.pad_token_id
            return first_groups(TrajectoryBatch.concat(parts, pad_token_id=pad), wanted)

    # ------------------------------------------------------------------ weights
    def publish(self) -> None:
        """The trained weights become the next policy version: gathered once (a collective
        under FSDP2: every rank calls it), loaded into this rank's engine, copied for its
        background worker."""
        self.version += 1
        weights = self.gather_weights()
        if self.owner:
            self.engine.update_weights(weights, self.version)
            if self.worker is not None:
                self.worker.publish(weights, self.version)

    def engine_metrics(self) -> dict[str, float]:
        """This rank's engine's own metrics (weight sync, servers); {} without one."""
        return self.engine.metrics() if self.owner else {}

    # ------------------------------------------------------------ the worker
    def _worker(self, step: int, examples: list[Example]) -> RolloutWorker:
        """The background worker, started at the first step of this process: on an engine
        with its own copy of the current weights, generating this rank's share of each step;
        a resumed run keeps its original version schedule and first serves the completions
        its checkpoint holds (``examples``: this rank's share of this step's prompts)."""
        if self.worker is None:
            restored = self._restored_worker or {}
            first = self.shares.share(self.config.trainer.batch_size).start
            self.worker = RolloutWorker(
                self.make_worker_engine(self.version),
                lambda prompts, s, on: self.runner.generate(
                    prompts, seed_index=s, engine=on, first_prompt=first, score=True
                ),
                max_staleness=self.max_staleness,
                start_step=restored.get("start_step", step),
                start_version=restored.get("start_version"),
                restored=self._restored_pending(restored.get("pending", []), step, examples),
                partial=self.config.rollout.partial,
                in_flight=self.config.rollout.in_flight,
            )
        return self.worker

    def _restored_pending(
        self, by_rank: list[dict[int, dict[str, Any]]], step: int, examples: list[Example]
    ) -> dict[int, Generation]:
        """This rank's share of the checkpoint's completions of steps ``step, step + 1,
        ...``, with their prompts drawn again from the sampler (``by_rank``: each rank's
        share, as :meth:`state_dict` stored them)."""
        ranks = self.shares.ranks
        if by_rank and len(by_rank) != ranks:
            raise ConfigError(
                f"the checkpoint holds background rollouts generated by {len(by_rank)} "
                f"process(es), each its share; resume it with {len(by_rank)} (this run has "
                f"{ranks}), or resume from a checkpoint of a run without rollout.max_staleness"
            )
        stored = by_rank[self.shares.rank] if by_rank else {}
        steps = sorted(int(s) for s in stored)
        if steps != list(range(step, step + len(steps))):
            raise ConfigError(
                f"the checkpoint holds rollouts of steps {steps}, but the run resumes at step "
                f"{step}; it was not written by this run"
            )
        share = self.shares.share(self.config.trainer.batch_size)
        upcoming = [examples] + [
            [self.samples[i] for i in indices][share.start : share.stop]
            for indices in self.sampler.peek(len(steps) - 1)
        ]
        return {
            s: self.runner.restore_generation(stored[s], prompts)
            for s, prompts in zip(steps, upcoming)
        }

    def close(self) -> None:
        """Stop the worker and release the runner and the engine (its servers)."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        if self.runner is not None:
            self.runner.close()
        if self.engine is not None:
            self.engine.close()

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The policy version, the refill sampler's position and, with a background worker,
        its version schedule and the completions it generated for the coming steps: each
        rank's share, gathered (every rank calls it; rank 0 writes checkpoints)."""
        state: dict[str, Any] = {"version": self.version}
        if self.refill_sampler is not None:
            state["refill_sampler"] = self.refill_sampler.state_dict()
        if self.max_staleness == 0:
            return state
        pending = {}
        if self.worker is not None:
            ahead = self.worker.pending(timeout=SAVE_WAIT_SECONDS)
            pending = {s: self.runner.generation_state(g) for s, g in ahead.items()}
        by_rank = self.shares.gathered(lambda: pending)
        if self.worker is not None:
            state["worker"] = {
                "start_step": self.worker.start_step,
                "start_version": self.worker.start_version,
                "pending": by_rank,
            }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (every rank: the engine's weights are gathered
        when the checkpoint's version is not the engine's)."""
        version = int(state["version"])
        if version != self.version:
            weights = self.gather_weights()
            if self.owner:
                self.engine.update_weights(weights, version)
            self.version = version
        if self.refill_sampler is not None and "refill_sampler" in state:
            self.refill_sampler.load_state_dict(state["refill_sampler"])
        self._restored_worker = state.get("worker")

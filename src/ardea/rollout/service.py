"""The rollout service: generation owned in one place (DESIGN.md, *Scale-out*).

One :class:`RolloutService` per run. On its **owner** — the only process of a one-process
run, rank 0 under torchrun — it holds the engine of the live policy and the policy version,
the runner that generates and scores on that engine, the background worker
(``rollout.max_staleness`` η ≥ 1: the scheduling policy that generates ahead, on an engine
with its own copy of the weights) and dynamic sampling's refills. The other ranks build no
engine and start no server.

A step's rollout (:meth:`RolloutService.rollout`): the owner generates all of the step's
prompts (rows are seeded by their global index, so the rollout is the one a single process
samples), scores them, drops and refills the groups without a reward spread, checks the
staleness bound, and hands the whole batch to every rank in one broadcast; each rank trains
on its share of complete groups (:mod:`ardea.trainer.step.split`), so every rank trains on
equal counts whatever the filter kept. An error on the owner is raised on every rank.

Weights (:meth:`RolloutService.publish`): gathered once per step, onto the owner (a
collective under FSDP2, so every rank calls it), loaded into the engine under the next
version (one atomic ``update_weights``) and copied for the worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any, Protocol

import torch

from ardea.data import Example, TrajectoryBatch
from ardea.data.sampler import EpochSampler
from ardea.errors import ArdeaError, ConfigError
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
from ardea.timing import PhaseTimer

REFILL_SEED_STREAM = 7  # seed offset of the refill sampler and its rollouts
SAVE_WAIT_SECONDS = 600.0  # longest a checkpoint waits for the rollouts it must hold

Weights = dict[str, torch.Tensor]


class Ranks(Protocol):
    """The processes of a run, as the service needs them (the trainer's
    :class:`~ardea.trainer.distributed.Distributed` is one)."""

    active: bool  # several processes (torchrun)
    is_main: bool  # rank 0, the engine's owner

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""


class RolloutService:
    """Owns generation for the whole run (module docstring).

    Args:
        config: the run config.
        dist: this process's rank; rank 0 owns the engine.
        engine: the live policy's engine on the owner, None on the other ranks.
        runner: generates and scores on ``engine`` (online runs, on the owner), else None.
        samples: the training prompts; ``sampler`` draws them (the worker peeks ahead).
        gather_weights: the policy's whole weights, on the owner ({} elsewhere); called on
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
        """Whether this process owns the engine (rank 0)."""
        return self.engine is not None

    def shared(self, compute: Callable[[], Any]) -> Any:
        """``compute()`` run on rank 0 (the owner, where there is an engine: a reward model's
        run has none), its result on every rank (one broadcast); an error there is raised on
        every rank, naming it on the others."""
        if not self.dist.active:
            return compute()
        result, error = None, None
        if self.dist.is_main:
            try:
                result = compute()
            except Exception as raised:  # handed to the other ranks, then raised here
                error = raised
        shared = self.dist.broadcast((result, None if error is None else repr(error)))
        if error is not None:
            raise error
        if shared[1] is not None:
            raise ArdeaError(f"the rollout service (rank 0) failed: {shared[1]}")
        return shared[0]

    # ------------------------------------------------------------------ a step
    def rollout(self, step: int, indices: Sequence[int], timer: PhaseTimer) -> Rollout:
        """The scored rollout of step ``step`` (the prompts at ``indices``): the whole
        batch, on CPU, on every rank, with its ``rollout/*`` metrics and samples. Under
        torchrun the other ranks' wait (and the broadcast) counts as ``generate``."""
        waiting = self.dist.active and not self.owner  # the owner times its own phases
        with timer.phase("generate") if waiting else nullcontext():
            return self.shared(lambda: self._rollout(step, indices, timer))

    def _rollout(self, step: int, indices: Sequence[int], timer: PhaseTimer) -> Rollout:
        examples = [self.samples[i] for i in indices]
        with timer.phase("generate"):
            generation = self._generate(step, examples)
        with timer.phase("score"):
            rollout = self.runner.score(generation)
        batch, metrics = rollout.batch.to("cpu"), dict(rollout.metrics)
        if self.refill_sampler is not None:
            batch = self._filter_and_refill(step, batch, len(examples), timer, metrics)
        lag = check_staleness(batch.versions, self.version, self.max_staleness)
        metrics["rollout/staleness"] = float(lag)
        return Rollout(batch, metrics, rollout.samples)

    def _generate(self, step: int, examples: list[Example]) -> Generation:
        if self.max_staleness == 0:
            return self.runner.generate(examples, seed_index=step)
        worker = self._worker(step, examples)
        worker.submit(step, examples)
        ahead = min(self.max_staleness, self.config.trainer.max_steps - step - 1)
        for offset, indices in enumerate(self.sampler.peek(ahead), start=1):
            worker.submit(step + offset, [self.samples[i] for i in indices])
        return worker.result(step)

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
            with timer.phase("generate"):
                generation = self.runner.generate(
                    examples, seed_index=(step, REFILL_SEED_STREAM, rounds)
                )
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
        """The trained weights become the next policy version: gathered once (onto the
        owner), loaded into its engine, copied for the background worker. Every rank calls
        it."""
        self.version += 1
        weights = self.gather_weights()
        if self.owner:
            self.engine.update_weights(weights, self.version)
            if self.worker is not None:
                self.worker.publish(weights, self.version)

    def engine_metrics(self) -> dict[str, float]:
        """The engine's own metrics (weight sync, servers), on the owner; {} elsewhere."""
        return self.engine.metrics() if self.owner else {}

    # ------------------------------------------------------------ the worker
    def _worker(self, step: int, examples: list[Example]) -> RolloutWorker:
        """The background worker, started at the first step of this process: on an engine
        with its own copy of the current weights; a resumed run keeps its original version
        schedule and first serves the completions its checkpoint holds (``examples``: this
        step's prompts)."""
        if self.worker is None:
            restored = self._restored_worker or {}
            self.worker = RolloutWorker(
                self.make_worker_engine(self.version),
                lambda prompts, s, on: self.runner.generate(
                    prompts, seed_index=s, engine=on, score=True
                ),
                max_staleness=self.max_staleness,
                start_step=restored.get("start_step", step),
                start_version=restored.get("start_version"),
                restored=self._restored_pending(restored.get("pending", {}), step, examples),
                partial=self.config.rollout.partial,
                in_flight=self.config.rollout.in_flight,
            )
        return self.worker

    def _restored_pending(
        self, stored: dict[int, dict[str, Any]], step: int, examples: list[Example]
    ) -> dict[int, Generation]:
        """The checkpoint's completions of steps ``step, step + 1, ...``, with their prompts
        drawn again from the sampler."""
        steps = sorted(int(s) for s in stored)
        if steps != list(range(step, step + len(steps))):
            raise ConfigError(
                f"the checkpoint holds rollouts of steps {steps}, but the run resumes at step "
                f"{step}; it was not written by this run"
            )
        upcoming = [examples] + [
            [self.samples[i] for i in indices] for indices in self.sampler.peek(len(steps) - 1)
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
        its version schedule and the completions it generated for the coming steps (the
        owner's: rank 0 writes checkpoints)."""
        state: dict[str, Any] = {"version": self.version}
        if self.refill_sampler is not None:
            state["refill_sampler"] = self.refill_sampler.state_dict()
        if self.worker is not None:
            pending = self.worker.pending(timeout=SAVE_WAIT_SECONDS)
            state["worker"] = {
                "start_step": self.worker.start_step,
                "start_version": self.worker.start_version,
                "pending": {s: self.runner.generation_state(g) for s, g in pending.items()},
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

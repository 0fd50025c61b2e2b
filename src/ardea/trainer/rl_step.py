"""One online RL training step, read top to bottom (:meth:`RLStep.run`).

1. **generate** (``perf/time_generate``): the step's prompts, ``rollout.group_size``
   completions each, with behaviour log-probs and policy versions. With
   ``rollout.max_staleness = 0`` the live policy's engine generates them now; with η ≥ 1 a
   :class:`~ardea.rollout.RolloutWorker` generated them ahead, on its own engine, from the
   policy exactly ``min(η, steps so far)`` versions old, and this phase waits for them.
2. **score** (``perf/time_score``): the rewards, and one :class:`~ardea.data.TrajectoryBatch`.
3. **filter** (``perf/time_filter``), only with ``algo.dynamic_sampling``: groups without a
   reward spread are dropped and refilled from fresh prompts generated and scored on the
   live policy (those rounds count in generate and score), :mod:`ardea.trainer.dynamic_sampling`.
4. the staleness check: a batch from a future version or more than η versions old raises
   :class:`~ardea.rollout.StalenessError` and never reaches a loss (``rollout/staleness``).
5. **advantages** (``perf/time_advantages``): the strategy pins what its loss needs on the
   whole batch (:meth:`~ardea.trainer.strategies.OnlineStrategy.pin`) for every pass.
6. **updates** (``perf/time_forward_backward``, ``perf/time_optimizer``):
   ``algo.ppo_epochs`` passes over ``algo.ppo_mini_batches`` mini-batches of whole groups,
   shuffled each epoch, each split into ``trainer.grad_accum_steps`` micro-batches
   (:class:`~ardea.trainer.updates.Updater`).
7. **weight_sync** (``perf/time_weight_sync``): the updated weights become the next policy
   version in the live engine (``update_weights``; copied for the worker); its metrics. The
   version counts training steps (not optimizer steps), as in verl and AReaL.
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
    RolloutWorker,
    Runner,
    check_staleness,
    sampling_seed,
)
from ardea.trainer.distributed import Distributed
from ardea.trainer.dynamic_sampling import (
    first_groups,
    group_count,
    keep_spread,
    refill_batches,
    renumber_groups,
)
from ardea.trainer.strategies import OnlineStrategy
from ardea.trainer.trajectory_samples import token_rows
from ardea.trainer.updates import PhaseTimer, Updater, step_throughput

SHUFFLE_STREAM = 1  # sampling_seed stream of the mini-batch shuffles (rollouts use step alone)
REFILL_SEED_STREAM = 7  # seed offset of the refill sampler and its rollouts
SAVE_WAIT_SECONDS = 600.0  # longest a checkpoint waits for the rollouts it must hold


class RLStep:
    """The online RL step and the state it keeps between steps (module docstring).

    Args:
        config: the run config.
        policy: the trained model.
        strategy: the online strategy (pin, loss).
        runner: generates and scores; its engine generates with the live policy.
        updater: the optimizer updates.
        samples: the training prompts, drawn in order by ``sampler``.
        sampler: the run's prompt sampler.
        make_worker_engine: builds an engine with its own copy of the weights, for the
            background worker (``rollout.max_staleness >= 1``).
        dist: this process's rank and the collectives; each rank generates and trains on
            its share of the step's prompts.
        full_weights: the policy's whole weights on every rank (gathered from shards).
    """

    def __init__(
        self,
        config: Any,
        *,
        policy: torch.nn.Module,
        strategy: OnlineStrategy,
        runner: Runner,
        updater: Updater,
        samples: Sequence[Example],
        sampler: EpochSampler,
        make_worker_engine: Callable[[], GenerationEngine],
        dist: Distributed,
        full_weights: Callable[[], dict[str, torch.Tensor]],
    ) -> None:
        self.config = config
        self.policy = policy
        self.strategy = strategy
        self.runner = runner
        self.updater = updater
        self.samples = samples
        self.sampler = sampler
        self.make_worker_engine = make_worker_engine
        self.dist = dist
        self.full_weights = full_weights
        self.max_staleness = int(config.rollout.max_staleness)
        self.device = next(policy.parameters()).device
        self.worker: RolloutWorker | None = None
        self._restored_worker: dict[str, Any] | None = None
        self.refill_sampler: EpochSampler | None = None
        if config.algo.dynamic_sampling:
            if not strategy.supports_dynamic_sampling:
                raise ConfigError(
                    f"algo.dynamic_sampling=true is not supported by algo.name="
                    f"{config.algo.name} (it filters groups by their reward spread for "
                    "group-baseline strategies: online_grpo)"
                )
            seed = config.trainer.seed * 1_000_003 + REFILL_SEED_STREAM
            self.refill_sampler = EpochSampler(len(samples), config.trainer.batch_size, seed)
        self.last_samples: list[tuple[str, str, float]] = []
        self.last_rows: list[dict] = []  # a few trained rows, token by token

    @property
    def engine(self) -> GenerationEngine:
        """The live policy's engine: its version is the policy version."""
        return self.runner.engine

    # -------------------------------------------------------------------- a step
    def run(self, step: int) -> dict[str, float]:
        """Train step ``step`` (0-based); returns its metrics."""
        timer = PhaseTimer()
        first, examples = self.dist.share(self._examples(self.sampler.next_batch()))
        with timer.phase("generate"):
            generation = self._generate(step, examples, first)
        with timer.phase("score"):
            rollout = self.runner.score(generation)
        metrics, self.last_samples = self.dist.mean(rollout.metrics), rollout.samples
        batch = renumber_groups(rollout.batch.to(self.device), first)  # global group ids
        if self.refill_sampler is not None:
            batch = self._filter_and_refill(step, batch, len(examples), timer, metrics)
        lag = check_staleness(batch.versions, self.engine.version, self.max_staleness)
        metrics["rollout/staleness"] = float(lag)
        forward = self.updater.precision.forward(self.updater.policy, batch.input_ids.shape[1])
        with timer.phase("advantages"), forward:
            batch = self._pin(batch, metrics)
        self.last_rows = token_rows(batch, self.runner.tokenizer)
        updates = self._updates(batch, step)
        metrics |= self.updater.run(updates, timer)
        with timer.phase("weight_sync"):
            self._publish()
        metrics |= self.engine.metrics()
        return metrics | step_throughput(updates, timer)

    def _examples(self, indices: Sequence[int]) -> list[Example]:
        return [self.samples[i] for i in indices]

    def _pin(self, batch: TrajectoryBatch, metrics: dict[str, float]) -> TrajectoryBatch:
        """The strategy's targets pinned on the step's whole rollout (group advantages,
        whitening, critic values see every rank's rows: each rank gathers the others' and
        pins the same global batch), then this rank's rows: those of its own groups."""
        if not self.dist.active:
            return self.strategy.pin(batch, metrics) if batch.rows else batch
        parts = [p.to(self.device) for p in self.dist.gather(batch.to("cpu"))]
        if sum(p.rows for p in parts) == 0:
            return batch
        pad = self.runner.tokenizer.pad_token_id
        whole = self.strategy.pin(TrajectoryBatch.concat(parts, pad_token_id=pad), metrics)
        own = torch.isin(whole.group_ids, torch.unique(batch.group_ids))  # (N,)
        return whole.select(torch.nonzero(own).squeeze(-1)).trim()

    def _generate(self, step: int, examples: list[Example], first: int) -> Generation:
        if self.max_staleness == 0:
            return self.runner.generate(examples, seed_index=step, first_prompt=first)
        worker = self._worker(step, examples)
        worker.submit(step, examples)
        ahead = min(self.max_staleness, self.config.trainer.max_steps - step - 1)
        for offset, indices in enumerate(self.sampler.peek(ahead), start=1):
            worker.submit(step + offset, self._examples(indices))
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
        (:mod:`ardea.trainer.dynamic_sampling`)."""
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
                refill = self.runner.score(generation).batch.to(self.device)
            with timer.phase("filter"):
                refill = renumber_groups(refill, next_group)
                next_group = int(refill.group_ids.max()) + 1
                parts.append(keep_spread(refill))
                have += group_count(parts[-1])
        metrics["rollout/refill_rounds"] = float(rounds)
        with timer.phase("filter"):
            pad = self.runner.tokenizer.pad_token_id
            return first_groups(TrajectoryBatch.concat(parts, pad_token_id=pad), wanted)

    def _updates(self, batch: TrajectoryBatch, step: int) -> list[list[TrajectoryBatch]]:
        algo = self.config.algo
        seed = sampling_seed(self.config.trainer.seed, step, SHUFFLE_STREAM)
        return split_updates(
            batch,
            epochs=algo.ppo_epochs,
            mini_batches=algo.ppo_mini_batches,
            micro_batches=self.config.trainer.grad_accum_steps,
            generator=torch.Generator().manual_seed(seed),
            # every rank must run as many forwards as the others (each gathers shards or
            # reduces gradients), so a rank's data may not decide how many there are
            by_length=not self.dist.active,
        )

    def _publish(self) -> None:
        """The trained weights become the next policy version, in the live engine (one
        atomic ``update_weights``) and, copied, for the background worker."""
        version = self.engine.version + 1
        weights = self.full_weights()
        self.engine.update_weights(weights, version)
        if self.worker is not None:
            self.worker.publish(weights, version)

    # ------------------------------------------------------------ the worker
    def _worker(self, step: int, examples: list[Example]) -> RolloutWorker:
        """The background worker, started at the first step of this process: on an engine
        with its own copy of the current weights; a resumed run keeps its original version
        schedule and first serves the completions its checkpoint holds (``examples``: this
        step's prompts)."""
        if self.worker is None:
            restored = self._restored_worker or {}
            engine = self.make_worker_engine()
            if engine.version < self.engine.version:
                engine.update_weights(self.full_weights(), self.engine.version)
            self.worker = RolloutWorker(
                engine,
                lambda prompts, s, on: self.runner.generate(prompts, seed_index=s, engine=on),
                max_staleness=self.max_staleness,
                start_step=restored.get("start_step", step),
                start_version=restored.get("start_version"),
                restored=self._restored_pending(restored.get("pending", {}), step, examples),
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
        upcoming = [examples] + [self._examples(i) for i in self.sampler.peek(len(steps) - 1)]
        return {
            s: self.runner.restore_generation(stored[s], prompts)
            for s, prompts in zip(steps, upcoming)
        }

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        self.runner.close()

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The policy version, the refill sampler's position and, with a background worker,
        its version schedule and the completions it generated for the coming steps."""
        state: dict[str, Any] = {"version": self.engine.version}
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
        if state["version"] != self.engine.version:
            self.engine.update_weights(self.full_weights(), int(state["version"]))
        if self.refill_sampler is not None and "refill_sampler" in state:
            self.refill_sampler.load_state_dict(state["refill_sampler"])
        self._restored_worker = state.get("worker")


def split_updates(
    batch: TrajectoryBatch,
    *,
    epochs: int,
    mini_batches: int,
    micro_batches: int,
    generator: torch.Generator,
    by_length: bool = True,
) -> list[list[TrajectoryBatch]]:
    """``epochs × mini_batches`` optimizer updates over the groups of ``batch``, each a list
    of ``micro_batches`` micro-batches (trimmed of padding columns), a micro-batch whose
    rows differ much in length run as a few forwards of similar lengths
    (:func:`length_buckets`; not with ``by_length=False``, e.g. under torchrun, where
    every rank must run the same number of forwards).

    Groups stay whole (a preference pair is a group of two) and a part keeps its rows in
    batch order; the groups are shuffled with ``generator`` at every epoch unless there is
    exactly one update (then the rollout's own order is kept). Empty parts are left out; a
    batch without rows gives no update.
    """
    if batch.rows == 0:
        return []
    _, group_of_row = torch.unique(batch.group_ids.cpu(), return_inverse=True)  # (N,)
    groups = int(group_of_row.max()) + 1
    lengths = batch.attention_mask.sum(dim=-1).cpu()  # (N,) real tokens per row
    group_length = torch.zeros(groups, dtype=lengths.dtype).scatter_reduce(
        0, group_of_row, lengths, reduce="amax"
    )  # (groups,) longest row of each group
    group_rows = torch.bincount(group_of_row, minlength=groups)  # (groups,)
    shuffle = epochs > 1 or mini_batches > 1
    updates = []
    for _ in range(epochs):
        order = torch.randperm(groups, generator=generator) if shuffle else torch.arange(groups)
        for mini in order.tensor_split(mini_batches):
            parts = [c for c in mini.tensor_split(micro_batches) if c.numel()]
            forwards = [
                bucket
                for c in parts
                for bucket in (
                    length_buckets(c, group_length[c], group_rows[c]) if by_length else [c]
                )
            ]
            if forwards:
                updates.append([batch.select(_rows_of(group_of_row, c)).trim() for c in forwards])
    return updates


MIN_SAVED_TOKENS = 512
MIN_SAVED_FRACTION = 0.25
"""A micro-batch is split into length buckets only where that saves at least
``MIN_SAVED_TOKENS`` padded token positions and ``MIN_SAVED_FRACTION`` of them: below, the
extra forward's fixed cost on a small model outweighs the saving."""


def length_buckets(groups: torch.Tensor, length: torch.Tensor, rows: torch.Tensor) -> list:
    """``groups`` of one micro-batch → lists of groups, each run as one forward.

    The cost of a forward is its padded size, ``rows × longest row``. Completions that end
    at their EOS after a few tokens next to one that runs to ``max_new_tokens`` make one
    forward mostly padding; the groups (kept whole) sorted by their longest row are cut in
    two where that saves the most, recursively, while a cut saves at least
    :data:`MIN_SAVED_TOKENS` positions and :data:`MIN_SAVED_FRACTION` of them. The loss is unchanged: every
    micro-batch is normalised by the step's global counts. Returns ``[groups]`` when no cut
    pays.

    Args:
        groups: ``(K,)`` group indices. length: ``(K,)`` longest row of each group.
        rows: ``(K,)`` rows of each group.
    """
    order = torch.argsort(length, stable=True)
    groups, length, rows = groups[order], length[order].tolist(), rows[order].tolist()
    cost = sum(rows) * max(length)
    best, cut, above = cost, None, 0
    below = sum(rows)
    for k in range(len(groups) - 1, 0, -1):  # cut before sorted group k
        above += rows[k]
        below -= rows[k]
        split = below * length[k - 1] + above * length[-1]
        if split < best:
            best, cut = split, k
    if cut is None or cost - best < max(MIN_SAVED_TOKENS, MIN_SAVED_FRACTION * cost):
        return [groups] if groups.numel() else []
    lower = length_buckets(groups[:cut], torch.tensor(length[:cut]), torch.tensor(rows[:cut]))
    upper = length_buckets(groups[cut:], torch.tensor(length[cut:]), torch.tensor(rows[cut:]))
    return lower + upper


def _rows_of(group_of_row: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """The rows whose group is one of ``groups``, in batch order."""
    return torch.nonzero(torch.isin(group_of_row, groups)).squeeze(-1)

"""Completions generated ahead of the trainer, in a background thread, with bounded staleness.

With ``rollout.max_staleness = η ≥ 1`` the trainer hands the worker the prompts of step
``s + η`` while it trains step ``s``; the worker generates them with its own engine (an
engine that owns a copy of the weights), so generation and training overlap. The
``generate`` it is given scores the completions too (the runner's ``score=True``), so the
reward functions run here, not on the trainer's step.

The weights follow a fixed schedule: the job of step ``s`` is generated with exactly the
policy version ``v(s) = v0 + max(0, s − s0 − η)``, where ``s0`` and ``v0`` are the step
and version the run's worker schedule started at. The trainer at step ``s`` holds version
``v0 + s − s0``, so every rollout it consumes lags by ``min(η, s − s0)`` versions: never
more than η, and the same lag, the same weights and (with the runner's per-step seeds) the
same tokens on every run, whatever the timing of the two threads.

Weight publication (:meth:`RolloutWorker.publish`) copies the trainer's tensors and tags the
copy with its version; the worker loads the copy a job needs with the engine's atomic
``update_weights(state, version)`` right before that job and drops older copies, so at most
η copies are held at once.

Partial rollouts (``partial=True``, ``rollout.partial``): a job starts, on a thread of its
own, as soon as the engine holds the version ``v(s)`` of the schedule, without waiting for
earlier jobs, so the rows of step ``s + 1`` join the engine while the slowest rows of step
``s`` still run (an engine that serves requests decodes them together); and every published
version is loaded at once: the engine stops the running
rows, loads the weights and lets them go on from their tokens so far (``in_flight="resume"``)
or sample again from their prompts (``"restart"``) under the new weights (the newest version
published; on an engine whose servers the ranks of a job share, ``engine.shared``, each
version in turn, so that every rank loads the same sequence). A completion then
holds tokens of several versions (``Completion.spans``); where a version starts depends on
the timing of the two threads, so two runs differ. The trainer checks the oldest token's lag
against η when it takes a rollout.

Resume: :meth:`RolloutWorker.pending` hands out (without consuming) the completions of the
steps submitted but not yet taken, waiting for those still being generated; a checkpoint
stores them, and a worker built with ``restored=`` serves them again, so the resumed run
trains on the very completions the uninterrupted run would have (the weights they came
from are gone by then). Nothing blocks forever: a failure inside the worker is handed to
the trainer as the exception of the job it broke, and a worker that has stopped or died is
reported instead of waited for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ardea.errors import ArdeaError, ConfigError
from ardea.rollout.checks import whole
from ardea.rollout.engine import GenerationEngine
from ardea.rollout.runner import Generation

POLL_SECONDS = 0.5  # how often a waiting side checks that the other side is still alive
GenerateFn = Callable[[Sequence[Any], int, GenerationEngine], Generation]


class RolloutWorkerError(ArdeaError):
    """The background rollout worker failed or was stopped."""


@dataclass(frozen=True)
class _Job:
    step: int
    examples: Sequence[Any]
    version: int  # the policy version the job must be generated with


class RolloutWorker:
    """Background generation of the completions of upcoming steps (module docstring).

    Args:
        engine: an engine that owns its weights (not the trainer's module).
        generate: ``generate(examples, step, engine) -> Generation``.
        max_staleness: η ≥ 1.
        start_step: ``s0`` of the version schedule (a resumed run passes its original one).
        start_version: ``v0`` of the version schedule (a resumed run passes its original
            one; defaults to the engine's version).
        restored: completions of steps already generated (from a checkpoint), by step.
        partial: partial rollouts (module docstring) instead of the fixed version schedule.
        in_flight: with ``partial``, what running rows do at a weight update: "resume" or
            "restart" (sets the engine's ``in_flight``).
    """

    def __init__(
        self,
        engine: GenerationEngine,
        generate: GenerateFn,
        *,
        max_staleness: int,
        start_step: int,
        start_version: int | None = None,
        restored: Mapping[int, Generation] | None = None,
        partial: bool = False,
        in_flight: str = "resume",
    ) -> None:
        if max_staleness < 1:
            raise ValueError(f"a rollout worker needs max_staleness >= 1, got {max_staleness}")
        self.engine = engine
        self.generate = generate
        self.max_staleness = max_staleness
        self.start_step = start_step
        self.start_version = engine.version if start_version is None else start_version
        self._cond = threading.Condition()
        self._jobs: list[_Job] = []
        self._results: dict[int, Generation | BaseException] = dict(restored or {})
        self._submitted: set[int] = set(self._results)
        self._snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self._stopping = False
        self.partial = partial
        if partial:
            if type(engine).submit is GenerationEngine.submit:
                raise ConfigError(
                    f"rollout.partial=true needs an engine that serves requests (submit, abort); "
                    f"the {type(engine).__name__} engine answers whole batches only"
                )
            engine.in_flight = in_flight
        self._job_threads: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._run, name="ardea-rollouts", daemon=True)
        self._thread.start()

    def version_for(self, step: int) -> int:
        """The policy version the completions of ``step`` start with (with ``partial``:
        at least this one)."""
        return self.start_version + max(0, step - self.start_step - self.max_staleness)

    # ----------------------------------------------------------------- trainer side
    def submit(self, step: int, examples: Sequence[Any]) -> None:
        """Queue the completions of ``step`` (steps are generated in the order submitted)."""
        with self._cond:
            if step in self._submitted:
                return
            self._check_alive()
            self._submitted.add(step)
            self._jobs.append(_Job(step, list(examples), self.version_for(step)))
            self._cond.notify_all()

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Make a copy of ``state_dict`` available to the worker as ``version`` (a sharded
        trainer's tensors gathered whole here, on the calling thread: a collective)."""
        copied = {k: whole(v).detach().clone() for k, v in state_dict.items()}
        with self._cond:
            self._snapshots[version] = copied
            self._cond.notify_all()

    def result(self, step: int) -> Generation:
        """The completions of ``step`` (submitted earlier); waits, re-raises its failure."""
        outcome = self._wait([step], timeout=None)[step]
        with self._cond:
            self._results.pop(step)
            self._submitted.discard(step)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def pending(self, timeout: float) -> dict[int, Generation]:
        """The completions of every submitted step not yet taken, by step, without taking
        them; waits up to ``timeout`` seconds for those still being generated."""
        with self._cond:
            steps = sorted(self._submitted)
        outcomes = self._wait(steps, timeout=timeout)
        for step, outcome in outcomes.items():
            if isinstance(outcome, BaseException):
                raise RolloutWorkerError(
                    f"the rollout of step {step} failed, so the checkpoint cannot hold it: "
                    f"{outcome}"
                ) from outcome
        return outcomes  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the worker (a running generation finishes first; pending jobs are dropped)
        and close its engine."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=60)
        self.engine.close()  # a job still generating fails with the engine
        for thread in self._job_threads:
            thread.join(timeout=60)

    def _wait(self, steps: list[int], timeout: float | None) -> dict[int, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            for step in steps:
                if step not in self._submitted:
                    raise RolloutWorkerError(f"the rollout of step {step} was never submitted")
                while step not in self._results:
                    self._check_alive()
                    if deadline is not None and time.monotonic() > deadline:
                        raise RolloutWorkerError(
                            f"the rollout of step {step} was not ready after {timeout:.0f} s"
                        )
                    self._cond.wait(POLL_SECONDS)
            return {step: self._results[step] for step in steps}

    def _check_alive(self) -> None:
        if self._stopping:
            raise RolloutWorkerError("the rollout worker was stopped")
        if not self._thread.is_alive():
            raise RolloutWorkerError("the rollout worker thread died without a result")

    # ------------------------------------------------------------------ worker side
    def _run(self) -> None:
        if self.partial:
            self._run_partial()
            return
        while True:
            with self._cond:
                while not self._jobs and not self._stopping:
                    self._cond.wait(POLL_SECONDS)
                if self._stopping:
                    return
                job = self._jobs.pop(0)
            try:
                if not self._load(job.version):
                    return
                outcome: Generation | BaseException = self.generate(
                    job.examples, job.step, self.engine
                )
            except BaseException as error:  # handed to the trainer, which raises it
                outcome = error
            with self._cond:
                self._results[job.step] = outcome
                self._cond.notify_all()

    def _run_partial(self) -> None:
        """Load each published version as soon as it comes; start each job, on a thread of
        its own, once the engine holds the version the schedule gives it (module docstring)."""
        waiting: list[_Job] = []
        while True:
            with self._cond:
                while True:
                    waiting += self._jobs
                    self._jobs = []
                    if self._stopping or self._newer() or self._startable(waiting):
                        break
                    self._cond.wait(POLL_SECONDS)
                if self._stopping:
                    return
                newest = self._newer()
                state = self._snapshots.pop(newest) if newest else None
                for old in [v for v in self._snapshots if newest and v <= newest]:
                    del self._snapshots[old]
            try:
                if state is not None:
                    self.engine.update_weights(state, newest)
            except BaseException as error:  # every job not yet taken fails with it
                with self._cond:
                    for step in self._submitted - set(self._results):
                        self._results[step] = error
                    self._cond.notify_all()
                return
            while self._startable(waiting):
                job = waiting.pop(0)
                thread = threading.Thread(
                    target=self._run_job, args=(job,), name=f"ardea-rollout-{job.step}", daemon=True
                )
                self._job_threads = [t for t in self._job_threads if t.is_alive()] + [thread]
                thread.start()

    def _startable(self, waiting: list[_Job]) -> bool:
        """Whether the first waiting job may start: the engine holds its version."""
        return bool(waiting) and self.engine.version >= waiting[0].version

    def _newer(self) -> int | None:
        """The version to load next, if one above the engine's is published: the newest
        (the next one on an engine the ranks share: module docstring)."""
        newer = [v for v in self._snapshots if v > self.engine.version]
        if not newer:
            return None
        return min(newer) if self.engine.shared else max(newer)

    def _run_job(self, job: _Job) -> None:
        try:
            outcome: Generation | BaseException = self.generate(job.examples, job.step, self.engine)
        except BaseException as error:  # handed to the trainer, which raises it
            outcome = error
        with self._cond:
            self._results[job.step] = outcome
            self._cond.notify_all()

    def _load(self, version: int) -> bool:
        """Put the engine on exactly ``version`` (waiting for its publication); False when
        the worker is stopped meanwhile."""
        engine = self.engine
        if engine.version > version:
            raise RolloutWorkerError(
                f"the worker's engine is at version {engine.version}, past the version "
                f"{version} a job needs"
            )
        with self._cond:
            while engine.version < version and version not in self._snapshots:
                if self._stopping:
                    return False
                self._cond.wait(POLL_SECONDS)
            state = self._snapshots.get(version)
            for old in [v for v in self._snapshots if v <= version]:
                del self._snapshots[old]
        if engine.version < version:
            engine.update_weights(state, version)
        return True

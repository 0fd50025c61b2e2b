"""Rollouts generated ahead of the trainer, in a background thread, with bounded staleness.

With ``rollout.max_staleness = η ≥ 1`` the trainer hands the worker the prompts of step
``s + η`` while it trains step ``s``; the worker generates them on its own engine (its own
copy of the weights), so generation and training overlap. The weights follow a fixed
schedule: the job of step ``s`` is generated with exactly the policy version
``v(s) = v0 + max(0, s − s0 − η)`` where ``s0`` and ``v0`` are the step and version the
worker started at. The trainer at step ``s`` holds version ``v0 + s − s0``, so every rollout
it consumes lags by ``min(η, s − s0)`` versions: never more than η, and the same lag, the
same weights and (with the runner's per-step seeds) the same tokens on every run, whatever
the timing of the two threads.

Weight publication (:meth:`RolloutWorker.publish`) copies the trainer's tensors and tags the
copy with its version; the worker loads the copy a job needs with the engine's atomic
``update_weights(state, version)`` right before that job and drops older copies, so at most
η copies are held at once. Nothing blocks forever: a failure inside the worker (a reward
error, an engine error) is handed to the trainer as the exception of the job it broke, and
a worker that has stopped or died is reported instead of waited for.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ardea.errors import ArdeaError
from ardea.rollout.runner import Rollout, RolloutRunner

POLL_SECONDS = 0.5  # how often a waiting side checks that the other side is still alive


class RolloutWorkerError(ArdeaError):
    """The background rollout worker failed or was stopped."""


@dataclass(frozen=True)
class _Job:
    step: int
    examples: Sequence[Any]
    version: int  # the policy version the job must be generated with


class RolloutWorker:
    """Background generation of the rollouts of upcoming steps (module docstring).

    Args:
        runner: a runner whose engine is *not* the trainer's model (a copy of the weights).
        max_staleness: η ≥ 1.
        start_step: the first step this worker will be asked for (``s0``).
    """

    def __init__(self, runner: RolloutRunner, *, max_staleness: int, start_step: int) -> None:
        if max_staleness < 1:
            raise ValueError(f"a rollout worker needs max_staleness >= 1, got {max_staleness}")
        self.runner = runner
        self.max_staleness = max_staleness
        self.start_step = start_step
        self.start_version = runner.engine.version
        self._cond = threading.Condition()
        self._jobs: list[_Job] = []
        self._submitted: set[int] = set()
        self._results: dict[int, Rollout | BaseException] = {}
        self._snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="ardea-rollouts", daemon=True)
        self._thread.start()

    def version_for(self, step: int) -> int:
        """The policy version the rollout of ``step`` is generated with."""
        return self.start_version + max(0, step - self.start_step - self.max_staleness)

    # ----------------------------------------------------------------- trainer side
    def submit(self, step: int, examples: Sequence[Any]) -> None:
        """Queue the rollout of ``step`` (steps are generated in the order submitted)."""
        with self._cond:
            if step in self._submitted:
                return
            self._check_alive()
            self._submitted.add(step)
            self._jobs.append(_Job(step, list(examples), self.version_for(step)))
            self._cond.notify_all()

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Make a copy of ``state_dict`` available to the worker as ``version``."""
        copied = {k: v.detach().clone() for k, v in state_dict.items()}
        with self._cond:
            self._snapshots[version] = copied
            self._cond.notify_all()

    def result(self, step: int) -> Rollout:
        """The rollout of ``step`` (submitted earlier); waits for it, re-raises its failure."""
        with self._cond:
            if step not in self._submitted:
                raise RolloutWorkerError(f"the rollout of step {step} was never submitted")
            while step not in self._results:
                self._check_alive()
                self._cond.wait(POLL_SECONDS)
            outcome = self._results.pop(step)
            self._submitted.discard(step)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def close(self) -> None:
        """Stop the worker (a running generation finishes first; pending jobs are dropped)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=60)

    def _check_alive(self) -> None:
        if self._stopping:
            raise RolloutWorkerError("the rollout worker was stopped")
        if not self._thread.is_alive():
            raise RolloutWorkerError("the rollout worker thread died without a result")

    # ------------------------------------------------------------------ worker side
    def _run(self) -> None:
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
                outcome: Rollout | BaseException = self.runner.rollout(
                    job.examples, seed_index=job.step
                )
            except BaseException as error:  # handed to the trainer, which raises it
                outcome = error
            with self._cond:
                self._results[job.step] = outcome
                self._cond.notify_all()

    def _load(self, version: int) -> bool:
        """Put the engine on exactly ``version`` (waiting for its publication); False when
        the worker is stopped meanwhile."""
        engine = self.runner.engine
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

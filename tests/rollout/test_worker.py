"""The background rollout worker: its fixed version schedule, weight publication, the
completions it hands a checkpoint, and failures reported instead of hangs."""

import weakref

import pytest
import torch
from runner_testing import EXAMPLES, make_runner

from ardea.errors import ConfigError
from ardea.rollout import (
    EngineSpec,
    GenerationEngine,
    RolloutWorker,
    RolloutWorkerError,
    make_engine,
    own_copy,
)

MODULES = weakref.WeakKeyDictionary()  # engine -> the module copy it generates with


def own_engine(runner, policy):
    """An engine with its own copy of ``policy``'s weights, at the runner engine's version."""
    module = own_copy(policy)
    engine = make_engine("in_process", EngineSpec.of(policy, runner.tokenizer), module=module)
    MODULES[engine] = module
    if runner.engine.version:
        engine.update_weights(policy.state_dict(), runner.engine.version)
    return engine


def start_worker(runner, policy, *, max_staleness=2, start_step=0, **kwargs):
    return RolloutWorker(
        own_engine(runner, policy),
        lambda examples, step, engine: runner.generate(examples, seed_index=step, engine=engine),
        max_staleness=max_staleness,
        start_step=start_step,
        **kwargs,
    )


def worker_on_copy(max_staleness=2, start_step=0, **kwargs):
    runner, policy = make_runner(**kwargs)
    worker = start_worker(runner, policy, max_staleness=max_staleness, start_step=start_step)
    return worker, runner, policy


def versions(generation) -> set[int]:
    return {c.version for c in generation.completions}


def test_version_schedule():
    """v(s) = v0 + max(0, s - s0 - eta): with eta = 2 and s0 = 5, steps 5..7 use v0 and each
    later step one version more."""
    worker, _, _ = worker_on_copy(max_staleness=2, start_step=5)
    try:
        assert [worker.version_for(s) for s in range(5, 10)] == [0, 0, 0, 1, 2]
    finally:
        worker.close()
    runner, policy = make_runner()
    runner.engine.update_weights(policy.state_dict(), 5)  # a run at version 5
    worker = start_worker(runner, policy, max_staleness=1, start_step=3)
    try:
        assert worker.engine.version == 5
        assert [worker.version_for(s) for s in range(3, 7)] == [5, 5, 6, 7]
    finally:
        worker.close()


def test_jobs_wait_for_their_version_and_use_exactly_it():
    """eta = 1: step 1's rollout is generated with version 0 even when version 2 was
    published before it was submitted, and step 2's with version 1 (published after 2); the
    published copies are the ones used."""
    worker, runner, policy = worker_on_copy(max_staleness=1)
    try:
        states = {0: {k: v.clone() for k, v in policy.state_dict().items()}}
        for version in (1, 2):
            with torch.no_grad():
                for p in policy.parameters():
                    p.mul_(1.01)
            states[version] = {k: v.clone() for k, v in policy.state_dict().items()}
        worker.submit(0, EXAMPLES)
        assert versions(worker.result(0)) == {0}
        # version 2 is already there when step 1 is generated: step 1 must still use 0
        worker.publish(states[2], 2)
        worker.submit(1, EXAMPLES)
        assert versions(worker.result(1)) == {0}
        model = MODULES[worker.engine].state_dict()
        assert all(torch.equal(model[k], states[0][k]) for k in model)  # not version 2's
        worker.submit(2, EXAMPLES)
        worker.publish(states[1], 1)  # published out of order: 2 came before 1
        generation = worker.result(2)
        assert versions(generation) == {1}
        model = MODULES[worker.engine].state_dict()
        assert all(torch.equal(model[k], states[1][k]) for k in model)
        # the same completions as the trainer's engine gives on version-1 weights (its
        # engine, on the trainer's module, takes them through update_weights)
        policy.load_state_dict(states[1])
        runner.engine.update_weights(policy.state_dict(), 1)
        same = runner.generate(EXAMPLES, seed_index=2)
        assert [c.token_ids for c in same.completions] == [
            c.token_ids for c in generation.completions
        ]
    finally:
        worker.close()


def test_a_failing_job_reaches_the_trainer_and_the_worker_survives():
    runner, policy = make_runner()
    calls = []

    def generate(examples, step, engine):
        calls.append(step)
        if step == 0:
            raise RuntimeError("engine out of memory")
        return runner.generate(examples, seed_index=step, engine=engine)

    worker = RolloutWorker(own_engine(runner, policy), generate, max_staleness=1, start_step=0)
    try:
        worker.submit(0, EXAMPLES)
        with pytest.raises(RuntimeError, match="engine out of memory"):
            worker.result(0)
        worker.submit(1, EXAMPLES)
        assert len(worker.result(1).completions) == len(EXAMPLES) * 3
        assert calls == [0, 1]
    finally:
        worker.close()


def test_pending_completions_are_handed_out_and_restored():
    """A checkpoint takes the completions of the submitted steps without consuming them; a
    worker built with them serves exactly those, and generates later steps on schedule."""
    worker, runner, policy = worker_on_copy(max_staleness=2)
    try:
        worker.submit(0, EXAMPLES)
        worker.submit(1, EXAMPLES)
        pending = worker.pending(timeout=60)
        assert sorted(pending) == [0, 1]
        assert worker.result(0).completions == pending[0].completions  # still there
    finally:
        worker.close()
    restored = start_worker(runner, policy, max_staleness=2, restored={1: pending[1]})
    try:
        restored.submit(1, EXAMPLES)  # already there: not generated again
        assert restored.result(1) is pending[1]
        restored.submit(2, EXAMPLES)
        assert versions(restored.result(2)) == {0}
    finally:
        restored.close()


def test_stopped_worker_unknown_steps_and_late_rollouts_are_errors():
    worker, _, _ = worker_on_copy(max_staleness=1)
    with pytest.raises(RolloutWorkerError, match="never submitted"):
        worker.result(3)
    worker.submit(0, EXAMPLES)
    worker.submit(5, EXAMPLES)  # needs version 4, which is never published
    worker.result(0)
    with pytest.raises(RolloutWorkerError, match="step 5 was not ready after 0 s"):
        worker.pending(timeout=0.2)
    worker.close()
    with pytest.raises(RolloutWorkerError, match="stopped"):
        worker.result(5)
    with pytest.raises(RolloutWorkerError, match="stopped"):
        worker.submit(6, EXAMPLES)


class BatchOnly(GenerationEngine):
    """An engine with the batch call only (no submit / abort), as a user's own may be."""

    version, max_context, stop_token_ids = 0, None, [1]

    def generate(self, prompts, params):
        raise AssertionError("never called")

    def update_weights(self, weights, version):
        raise AssertionError("never called")


def test_partial_rollouts_need_an_engine_that_serves_requests():
    with pytest.raises(
        ConfigError, match=r"rollout\.partial=true needs an engine that serves requests.*BatchOnly"
    ):
        RolloutWorker(BatchOnly(), lambda *a: None, max_staleness=1, start_step=0, partial=True)

"""The background rollout worker: its fixed version schedule, weight publication, and
failures reported instead of hangs."""

import pytest
import torch
from runner_testing import EXAMPLES, make_runner

from ardea.reward import RewardError, RewardScorer
from ardea.rollout import RolloutWorker, RolloutWorkerError


def worker_on_copy(max_staleness=2, start_step=0, **kwargs):
    runner, policy = make_runner(**kwargs)
    return (
        RolloutWorker(runner.detached_copy(), max_staleness=max_staleness, start_step=start_step),
        runner,
        policy,
    )


def test_detached_copy_has_its_own_weights():
    runner, policy = make_runner()
    copy = runner.detached_copy()
    assert copy.engine.model is not policy and copy.engine.version == runner.engine.version
    with torch.no_grad():
        next(policy.parameters()).add_(1.0)
    mine, theirs = next(policy.parameters()), next(copy.engine.model.parameters())
    assert not torch.equal(mine, theirs)


def test_version_schedule():
    """v(s) = v0 + max(0, s - s0 - eta): with eta = 2 and s0 = 5, steps 5..7 use v0 and each
    later step one version more."""
    worker, _, _ = worker_on_copy(max_staleness=2, start_step=5)
    try:
        assert [worker.version_for(s) for s in range(5, 10)] == [0, 0, 0, 1, 2]
    finally:
        worker.close()
    runner, _ = make_runner()
    runner.engine.update_weights(None, 5)  # a resumed run: the worker starts at version 5
    worker = RolloutWorker(runner.detached_copy(), max_staleness=1, start_step=3)
    try:
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
        assert worker.result(0).batch["versions"].max() == 0
        # version 2 is already there when step 1 is generated: step 1 must still use 0
        worker.publish(states[2], 2)
        worker.submit(1, EXAMPLES)
        first = worker.result(1)
        assert first.batch["versions"].max() == 0
        model = worker.runner.engine.model.state_dict()
        assert all(torch.equal(model[k], states[0][k]) for k in model)  # not version 2's
        worker.submit(2, EXAMPLES)
        worker.publish(states[1], 1)  # published out of order: 2 came before 1
        rollout = worker.result(2)
        assert set(rollout.batch["versions"][rollout.batch["versions"] >= 0].tolist()) == {1}
        model = worker.runner.engine.model.state_dict()
        assert all(torch.equal(model[k], states[1][k]) for k in model)
        # the same rollout as the trainer's engine gives on version-1 weights
        policy.load_state_dict(states[1])
        same = runner.rollout(EXAMPLES, seed_index=2).batch
        assert torch.equal(same["input_ids"], rollout.batch["input_ids"])
    finally:
        worker.close()


def test_a_failing_reward_reaches_the_trainer():
    def broken(prompts, completions, rows):
        raise RuntimeError("reward server down")

    worker, runner, _ = worker_on_copy(max_staleness=1)
    worker.runner.scorer = RewardScorer([(broken, 1.0)], timeout_s=5.0)
    try:
        worker.submit(0, EXAMPLES)
        with pytest.raises(RewardError, match="reward server down"):
            worker.result(0)
        worker.runner.scorer = runner.scorer
        worker.submit(1, EXAMPLES)  # the worker survives a failed job
        assert worker.result(1).batch["rewards"].numel() == len(EXAMPLES) * 3
    finally:
        worker.close()


def test_stopped_worker_and_unknown_steps_are_errors():
    worker, _, _ = worker_on_copy(max_staleness=1)
    with pytest.raises(RolloutWorkerError, match="never submitted"):
        worker.result(3)
    worker.submit(0, EXAMPLES)
    worker.submit(5, EXAMPLES)  # needs version 4, which is never published
    worker.result(0)
    worker.close()
    with pytest.raises(RolloutWorkerError, match="stopped"):
        worker.result(5)
    with pytest.raises(RolloutWorkerError, match="stopped"):
        worker.submit(6, EXAMPLES)

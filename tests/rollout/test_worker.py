"""The background rollout worker: its fixed version schedule, weight publication, and
failures reported instead of hangs."""

import pytest
import torch
from test_runner import EXAMPLES, make_runner

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
    worker, _, _ = worker_on_copy(max_staleness=2, start_step=5)
    try:
        assert [worker.version_for(s) for s in range(5, 10)] == [0, 0, 0, 1, 2]
    finally:
        worker.close()


def test_jobs_wait_for_their_version_and_use_exactly_it():
    """eta = 1: step 1's rollout must be generated with version 0 even after version 2 is
    published, and step 2's with version 1; the published copies are the ones used."""
    worker, runner, policy = worker_on_copy(max_staleness=1)
    try:
        states = {}
        for version in (1, 2):
            with torch.no_grad():
                for p in policy.parameters():
                    p.mul_(1.01)
            states[version] = {k: v.clone() for k, v in policy.state_dict().items()}
        worker.submit(0, EXAMPLES)
        worker.submit(1, EXAMPLES)
        assert worker.result(0).batch["versions"].max() == 0
        assert worker.result(1).batch["versions"].max() == 0
        worker.submit(2, EXAMPLES)
        worker.publish(states[2], 2)  # published out of order: version 1 is still missing
        worker.publish(states[1], 1)
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

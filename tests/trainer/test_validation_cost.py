"""A trajectory batch is validated where it is built, not on every copy: a training step
checks its rollout the same number of times however many epochs, mini-batches and
micro-batches it cuts it into (each check costs device syncs on a GPU)."""

from online_testing import RUN

import ardea.data.trajectory as trajectory
from ardea.config import load_config
from ardea.trainer import Trainer


def validations(tmp_path, monkeypatch, *overrides) -> int:
    calls = []
    real = trajectory.validate
    monkeypatch.setattr(trajectory, "validate", lambda batch: calls.append(1) or real(batch))
    run = [*RUN, "trainer.max_steps=1", f"trainer.output_dir={tmp_path}", *overrides]
    Trainer(load_config(None, run)).train()
    return len(calls)


def test_one_check_per_built_batch_whatever_the_micro_batches(tmp_path, monkeypatch, reward_module):
    one = validations(tmp_path / "one", monkeypatch)
    many = validations(
        tmp_path / "many", monkeypatch,
        "trainer.grad_accum_steps=4", "algo.ppo_epochs=2", "algo.ppo_mini_batches=2",
    )  # fmt: skip
    assert many == one
    assert one <= 2  # the step's rollout (and nothing per pass over it)

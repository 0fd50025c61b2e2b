"""The profile of a run's steps: seconds per phase, their shares, what no phase covers."""

import json

import pytest

from ardea.config import load_config
from ardea.trainer import Trainer
from ardea.trainer.profile import StepProfile


def test_profile_by_hand():
    profile = StepProfile()
    profile.add({"perf/time_generate": 0.5, "perf/time_forward_backward": 0.3, "x": 9.0}, 1.0)
    profile.add({"perf/time_generate": 0.3, "perf/time_forward_backward": 0.5}, 1.0)
    summary = profile.summary()
    assert summary["steps"] == 2 and summary["seconds_per_step"] == 1.0
    assert summary["phases"]["generate"] == {"seconds_per_step": 0.4, "share": 0.4}
    assert summary["phases"]["forward_backward"] == {"seconds_per_step": 0.4, "share": 0.4}
    assert summary["phases"]["other"] == {"seconds_per_step": 0.2, "share": 0.2}
    assert StepProfile().summary() == {}


def test_an_online_run_writes_its_profile(tmp_path, reward_module):
    from online_testing import RUN

    trainer = Trainer(
        load_config(None, [*RUN, "trainer.max_steps=3", f"trainer.output_dir={tmp_path}"])
    )
    trainer.train()
    profile = json.loads((tmp_path / "results.json").read_text())["profile"]
    assert profile["steps"] == 3
    names = set(profile["phases"])
    assert {
        "generate",
        "score",
        "advantages",
        "forward_backward",
        "optimizer",
        "weight_sync",
    } <= names
    assert sum(p["share"] for p in profile["phases"].values()) == pytest.approx(1.0, abs=1e-3)
    assert profile["seconds_per_step"] == pytest.approx(trainer.train_seconds / 3, rel=1e-3)

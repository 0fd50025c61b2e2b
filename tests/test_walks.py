"""The policy loss stays within three calls of the update, and a step's walk is counted:
``scripts/walks.py`` on a real ``ardea train`` of the shipped online GRPO config."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_walks():
    spec = importlib.util.spec_from_file_location("walks", ROOT / "scripts" / "walks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_loss_is_three_calls_from_the_update(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    walk = load_walks().run_walk("grpo", tmp_path)
    assert walk.loss_stack is not None, "the GRPO step never reached the ppo formula"
    frames = [frame.split(":")[1] for frame in walk.loss_stack]
    assert frames[0] == "main"  # ardea.cli.main.main: the command a user types
    update = frames.index("Updater._forward_backward")
    assert frames[update + 1 :] == ["GRPOStrategy.loss", "policy_objective", "ppo"]
    # the second step alone was counted: the files it entered include the rollout's and
    # the loss's, and no end-of-run writer (report, results)
    assert {"ardea/rollout/runner.py", "ardea/algo/policy_loss.py"} <= walk.files
    assert not {"ardea/trainer/report.py", "ardea/trainer/results.py"} & walk.files

"""Agent workflows through the trainer: a workflow written with the ``openai`` package
only trains with online GRPO and turn-level PPO, in process and over HTTP; with
background rollouts (η = 1) a run killed with SIGKILL resumes bit for bit; the workflow
options are checked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from online_testing import metrics
from safetensors.torch import load_file
from tiny_models import SMALL_OVERRIDES

from ardea.config import load_config
from ardea.errors import ConfigError
from ardea.trainer import Trainer

ROOT = Path(__file__).parents[2]
WORKFLOW = "examples/agents/guess_number_openai.py:run"  # a file path, as a user's
PPO_TURN = [
    "algo.name=online_ppo",
    "algo.ppo.gae_timestep_unit=turn",
    "algo.ppo.gae_lambda=ardea.algo.lambda_fn.vapo_length_adaptive_gae",
    "algo.ppo.gae_lambda_kwargs={alpha: 1.0}",
]


@pytest.fixture
def rows(tmp_path) -> list[str]:
    """Training rows (targets 1..8, twice) and held-out rows (1..8) as JSONL files."""
    train, held_out = tmp_path / "rows.jsonl", tmp_path / "eval.jsonl"
    train.write_text(
        "".join(json.dumps({"target": 1 + i % 8, "high": 8}) + "\n" for i in range(16))
    )
    held_out.write_text("".join(json.dumps({"target": t, "high": 8}) + "\n" for t in range(1, 9)))
    return [
        "data.task=null",
        f"data.path={train}",
        f"data.eval_path={held_out}",
        "data.eval_size=4",
        f"agent.workflow={WORKFLOW}",
        "model.compute_dtype=float32",
        *SMALL_OVERRIDES,
        "rollout.group_size=4",
        "rollout.max_new_tokens=3",
        "trainer.batch_size=4",
        "trainer.max_steps=3",
        "trainer.warmup_steps=1",
        "trainer.eval_every=0",
        "trainer.save_every=0",
        "logging.log_every=1",
        "logging.progress=false",
        "logging.tensorboard=false",
        "logging.report=false",  # no report.png: half a second a run
    ]


def train(run_dir, *overrides):
    cwd = os.getcwd()
    os.chdir(ROOT)  # the workflow's file path is relative to where the run starts
    try:
        config = load_config(None, [*overrides, f"trainer.output_dir={run_dir}"])
        trainer = Trainer(config)
        return trainer, trainer.train()
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize(
    ("transport", "algo"),
    [("in_process", PPO_TURN), ("http", ["algo.name=online_grpo"])],
    ids=["in_process-ppo", "http-grpo"],
)
def test_a_workflow_trains_through_the_rl_step(tmp_path, rows, transport, algo):
    trainer, results = train(tmp_path / "run", *rows, *algo, f"agent.transport={transport}")
    assert results["steps"] == 3 and trainer.service.engine.version == 3
    records = [r for r in metrics(tmp_path / "run") if "agent/turns_per_episode" in r]
    assert len(records) == 3
    for r in records:
        assert 1.0 <= r["agent/turns_per_episode"] <= 4.0
        assert r["agent/workflow_failures"] == 0.0 and 1.0 <= r["agent/info/guesses"] <= 4.0
        assert 0.0 <= r["agent/success_rate"] <= 1.0 and r["agent/context_tokens"] > 0
    final = [r for r in metrics(tmp_path / "run") if "eval/success_rate" in r]
    assert final and 0.0 <= final[-1]["eval/success_rate"] <= 1.0  # 4 held-out rows, greedy


def test_the_same_run_gives_the_same_weights_in_process_and_over_http(tmp_path, rows):
    """The transport changes how calls travel, not what is sampled or trained."""
    runs = [train(tmp_path / t, *rows, "algo.name=online_grpo", f"agent.transport={t}")[0]
            for t in ("in_process", "http")]  # fmt: skip
    a, b = (r.policy.state_dict() for r in runs)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def ardea(*args: str) -> list[str]:
    return [sys.executable, "-m", "ardea.cli.main", "train", *args]


def logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return max((json.loads(x)["step"] for x in lines if x.endswith("}")), default=-1)


@pytest.mark.slow
def test_a_killed_workflow_run_resumes_bit_for_bit(tmp_path, rows):
    """η = 1: killed (SIGKILL) after the step-2 checkpoint, whose pending episodes the
    resumed run trains on; the weights and metrics equal an uninterrupted run's."""
    config = tmp_path / "workflow.yaml"  # a config file: without one, the default recipe
    config.write_text("trainer: {run_name: workflow}\n")
    base = [str(config), *rows, *PPO_TURN, "rollout.max_staleness=1", "trainer.max_steps=5",
            "trainer.save_every=2", "trainer.keep_last=4"]  # fmt: skip
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    run = {"cwd": ROOT, "capture_output": True}
    subprocess.run(ardea(*base, f"trainer.output_dir={reference}"), check=True, **run)
    command = ardea(*base, f"trainer.output_dir={resumed}", "trainer.resume=auto")
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 300
    while logged(resumed) < 3:
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert (resumed / "checkpoints" / "step_0000002" / "COMPLETE").is_file()
    state = torch.load(resumed / "checkpoints" / "step_0000002" / "trainer_state.pt",
                       weights_only=True)  # fmt: skip
    (share,) = state["rollouts"]["worker"]["pending"]  # each rank's: one process, one share
    (pending,) = share.values()
    assert pending["calls"] and len(pending["episodes"]) == 4 * 4
    subprocess.run(command, check=True, **run)
    final = "checkpoints/step_0000005/policy/model.safetensors"
    a, b = load_file(reference / final), load_file(resumed / final)
    for name in a:
        assert a[name].equal(b[name]), name
    strip = [{k: v for k, v in r.items() if k != "time" and not k.startswith("perf/")}
             for r in metrics(reference)]  # fmt: skip
    again = [{k: v for k, v in r.items() if k != "time" and not k.startswith("perf/")}
             for r in metrics(resumed)]  # fmt: skip
    assert again == strip and [r["rollout/staleness"] for r in strip if "rollout/staleness" in r]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("agent.env=guess_number", "agent.env='guess_number' and agent.workflow=.* both set"),
        ("data.path=null", "agent.workflow plays the rows of data.path"),
        ("data.task=arithmetic", "data.task='arithmetic' is not used"),
        ("agent.transport=grpc", "agent.transport='grpc'"),
        ("agent.max_concurrency=0", "agent.max_concurrency"),
        ("agent.workflow_timeout_s=0", "agent.workflow_timeout_s"),
        ("agent.workflow=tests/agent/nothing.py:run", "no file"),
        ("reward.functions=[{name: length}]", "the workflow returns the reward"),
        ("algo.name=sft", "plays episodes for online strategies"),
    ],
)
def test_workflow_options_are_checked(tmp_path, rows, override, message):
    with pytest.raises(ConfigError, match=message):
        train(tmp_path, *rows, *PPO_TURN, override)

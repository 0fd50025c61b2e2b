"""Exact resume: a run killed with SIGKILL and restarted with trainer.resume=auto ends
with the same weights (bit for bit) and the same metrics as a run never interrupted."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file
from tiny_models import SMALL_OVERRIDES

pytestmark = pytest.mark.slow
SFT_CONFIG = Path(__file__).parents[2] / "configs" / "sft_arithmetic.yaml"

RUN = [
    *SMALL_OVERRIDES,
    "data.task_args.digits=2",
    "data.train_size=300",
    "data.eval_size=20",
    "trainer.batch_size=16",
    "trainer.grad_accum_steps=2",
    "trainer.max_steps=60",
    "trainer.warmup_steps=5",
    "trainer.save_every=10",
    "trainer.keep_last=2",
    "trainer.eval_every=25",
    "trainer.num_threads=1",
    "logging.log_every=1",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.report=false",  # no report.png: half a second a run
]


def command(run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ardea.cli.main",
        "train",
        str(SFT_CONFIG),
        *RUN,
        f"trainer.output_dir={run_dir}",
        *extra,
    ]


def last_logged_step(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return -1
    steps = [
        json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")
    ]
    return max(steps, default=-1)


def kill_when(run_dir: Path, step: int) -> None:
    """Start a run and SIGKILL it once it has logged ``step``."""
    process = subprocess.Popen(
        command(run_dir, "trainer.resume=auto"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while last_logged_step(run_dir) < step:
        assert process.poll() is None, "the run ended before the kill point"
        assert time.time() < deadline
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


def final_state(run_dir: Path):
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    weights = load_file(checkpoints[-1] / "policy" / "model.safetensors")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    comparable = [
        {k: v for k, v in r.items() if k != "time" and not k.startswith("perf/")} for r in records
    ]
    return checkpoints[-1].name, weights, comparable


def test_killed_runs_resume_to_the_same_result(tmp_path):
    reference_dir = tmp_path / "reference"
    subprocess.run(command(reference_dir), check=True, capture_output=True, timeout=600)
    name, weights, records = final_state(reference_dir)
    assert name == "step_0000060"

    resumed_dir = tmp_path / "resumed"
    for kill_step in (4, 17, 43):  # before any checkpoint, between checkpoints, after an eval
        kill_when(resumed_dir, kill_step)
    subprocess.run(
        command(resumed_dir, "trainer.resume=auto"), check=True, capture_output=True, timeout=600
    )
    name2, weights2, records2 = final_state(resumed_dir)

    assert name2 == name
    assert weights.keys() == weights2.keys()
    for key in weights:
        assert weights[key].equal(weights2[key]), key
    assert records2 == records
    results = json.loads((resumed_dir / "results.json").read_text())
    assert results["steps"] == 60


def test_a_run_directory_with_checkpoints_is_not_overwritten(tmp_path):
    run_dir = tmp_path / "run"
    subprocess.run(
        command(run_dir, "trainer.max_steps=10"), check=True, capture_output=True, timeout=600
    )
    again = subprocess.run(
        command(run_dir, "trainer.max_steps=10"), capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 2
    assert "holds a run of this config" in again.stderr and "trainer.resume=auto" in again.stderr

"""Two CPU processes under ``torchrun`` (gloo) against the single-process run.

For sft, offline grpo, online_grpo and online_ppo, under FSDP2 and DDP (the runs are in
``cases.py``; one torchrun launch runs all of them to pay the start-up once):

- one optimizer step at world size 2 gives the weights of one single-process step on the
  same global batch (max abs difference <= 1e-6, float32);
- a checkpoint saved at world size 2 loads at world size 1 bit for bit (weights, optimizer,
  critic and its optimizer), and the reverse; the resumed second step matches the
  uninterrupted single-process run;
- ``kill -9`` of one rank ends the run with an error naming the rank in under 60 s and
  leaves every checkpoint already written intact; a rank that hangs fails the other's next
  collective after ``trainer.dist_timeout_s`` with an error naming it.

Why 1e-6 holds: the ranks' gradients are sums in another order than one process's, about
1e-7 relative apart. Adam's first step is ``lr * g / (|g| + eps)``, which turns that into
``lr``-sized differences only for entries whose gradient is about ``eps`` (1e-8) or zero in
exact arithmetic; with ``lr = 5e-4`` (steps of ~5e-4, checked below) such entries stay
within 1e-6, and the llama tiny model has no key bias (whose gradient is exactly zero).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ardea.trainer.checkpoint import STATE_FILE, checkpoint_problem, list_checkpoints

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
REPO = HERE.parents[1]
CASES = str(HERE / "cases.py")
ALGOS = ("sft", "grpo", "online_grpo", "online_ppo")
RESUMED = ("sft", "online_ppo")  # as in cases.py
MODES = ("fsdp2", "ddp")
TOLERANCE = 1e-6


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]  # fmt: skip


def run(command: list[str], timeout: float = 300) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Every run of ``cases.py``: one process, then two (fresh and resumed), then one
    process resuming the two-process checkpoints."""
    root = tmp_path_factory.mktemp("distributed")
    run([sys.executable, CASES, "reference", str(root), "none"])
    run(torchrun(CASES, "fresh+resume", str(root), *MODES))
    run([sys.executable, CASES, "resume", str(root), *MODES])
    return root


def final(run_dir: Path) -> Path:
    return list_checkpoints(run_dir)[-1]


def weights(run_dir: Path, module: str = "policy") -> dict[str, torch.Tensor]:
    return load_file(str(final(run_dir) / module / "model.safetensors"))


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def initial_weights(algo: str) -> dict[str, torch.Tensor]:
    """The weights every run of ``algo`` starts from (built as the trainer builds them)."""
    sys.path.insert(0, str(HERE))
    from cases import overrides

    from ardea.config import load_config
    from ardea.trainer.setup import build_policy

    config = load_config(None, overrides(algo, Path("unused"), "none", 1, "never"))
    model, _ = build_policy(config.model, seed=config.trainer.seed, device=torch.device("cpu"))
    return model.state_dict()


def modules(algo: str) -> tuple[str, ...]:
    return ("policy", "critic") if algo == "online_ppo" else ("policy",)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("algo", ALGOS)
def test_one_step_at_two_processes_equals_one_process(runs, algo, mode):
    one, two = runs / "1" / "none" / algo, runs / "2" / mode / algo
    for module in modules(algo):
        assert max_diff(weights(one, module), weights(two, module)) <= TOLERANCE
    # the step is real: it moved the weights by ~lr from the initial ones, far beyond the
    # tolerance (every run starts from the same seeded tiny model)
    trained, initial = weights(one), initial_weights(algo)
    assert max_diff(trained, {k: initial[k] for k in trained}) > 1e-4


def assert_same(a, b, where: str = "") -> None:
    """``a`` and ``b`` equal bit for bit (tensors) or by value (anything else), recursively."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def assert_loaded_exactly(resumed: Path, checkpoint: Path, algo: str) -> None:
    """What the resumed run held after loading ``checkpoint`` is the checkpoint, bit for bit."""
    loaded = torch.load(resumed / "loaded.pt", weights_only=True)
    saved = torch.load(checkpoint / STATE_FILE, weights_only=True)
    policy = load_file(str(checkpoint / "policy" / "model.safetensors"))
    assert_same({k: loaded["policy"][k] for k in policy}, policy, "policy")
    assert_same(loaded["updater"], saved["updater"], "updater")
    assert_same(loaded["strategy"], saved["strategy"], "strategy")
    if algo == "online_ppo":
        critic = load_file(str(checkpoint / "critic" / "model.safetensors"))
        held = {("model." + k[6:] if k.startswith("model.") else "score." + k[11:]): v
                for k, v in loaded["modules"]["critic"].items()}  # fmt: skip
        assert_same(held, critic, "critic")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("algo", RESUMED)
def test_checkpoints_resume_at_the_other_world_size(runs, algo, mode):
    uninterrupted = runs / "1" / "none" / f"{algo}_two"
    from_two = runs / "1" / "none" / f"{algo}_from_{mode}"  # saved at 2, resumed at 1
    from_one = runs / "2" / mode / f"{algo}_resumed"  # saved at 1, resumed at 2
    assert_loaded_exactly(from_two, final(runs / "2" / mode / algo), algo)
    assert_loaded_exactly(from_one, final(runs / "1" / "none" / algo), algo)
    for resumed in (from_two, from_one):
        for module in modules(algo):
            assert max_diff(weights(uninterrupted, module), weights(resumed, module)) <= TOLERANCE


def launch_forever(root: Path, *extra: str) -> subprocess.Popen:
    """The never-ending 2-process run of ``cases.py``, once it has written a checkpoint."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = torchrun(CASES, "forever", str(root), "fsdp2", *extra)
    launch = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 120
    while len(list((root / "run" / "checkpoints").glob("step_*"))) < 2:
        if launch.poll() is not None or time.monotonic() > deadline:
            launch.kill()
            raise AssertionError(
                "no two checkpoints within 120 s:\n" + launch.stdout.read()[-3000:]
            )
        time.sleep(0.2)
    return launch


def end_of(launch: subprocess.Popen, seconds: float) -> str:
    """The launch's output once it ended, which it must within ``seconds``."""
    started = time.monotonic()
    try:
        output, _ = launch.communicate(timeout=seconds)
    finally:
        if launch.poll() is None:
            launch.kill()
    assert time.monotonic() - started < seconds
    assert launch.returncode != 0
    return output


def assert_checkpoints_intact(root: Path) -> None:
    written = sorted((root / "run" / "checkpoints").glob("step_*"))
    assert written
    assert all(checkpoint_problem(path) is None for path in written)


def test_killing_a_rank_ends_the_run_naming_it_and_keeps_checkpoints(tmp_path):
    launch = launch_forever(tmp_path)
    os.kill(int((tmp_path / "pid_1").read_text()), signal.SIGKILL)
    output = end_of(launch, 60)
    assert re.search(r"rank\s*:\s*1\b", output) and "SIGKILL" in output, output[-3000:]
    assert_checkpoints_intact(tmp_path)


def test_a_hung_rank_fails_the_others_within_the_timeout_naming_it(tmp_path):
    """A rank that stops (SIGSTOP: alive to torchrun, silent to its peers) makes rank 0's
    next collective fail after trainer.dist_timeout_s, with an error naming rank 1."""
    launch = launch_forever(tmp_path, "trainer.dist_timeout_s=5")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(launch.stdout), daemon=True)
    reader.start()
    hung = int((tmp_path / "pid_1").read_text())
    os.kill(hung, signal.SIGSTOP)
    stopped = time.monotonic()
    while not any("stopped responding" in line for line in lines):
        assert time.monotonic() - stopped < 60, "".join(lines)[-3000:]
        time.sleep(0.2)
    os.kill(hung, signal.SIGKILL)  # torchrun would wait 30 s for the stopped rank to exit
    launch.wait(timeout=60)
    reader.join(timeout=10)
    output = "".join(lines)
    assert launch.returncode != 0
    assert "rank 1 stopped responding" in output and "trainer.dist_timeout_s=5" in output
    assert_checkpoints_intact(tmp_path)

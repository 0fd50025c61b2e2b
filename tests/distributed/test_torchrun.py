"""Two CPU processes under ``torchrun`` (gloo) against the single-process run.

For sft, offline grpo, online_grpo and online_ppo, under FSDP2 and DDP (the runs are in
``cases.py``; one torchrun launch runs all of them to pay the start-up once):

- one optimizer step at world size 2 does the mathematics of one single-process step on the
  same global batch: the same gradients, up to float32 rounding of the sums (below), and
  weights that are exactly AdamW's step on those gradients;
- a checkpoint saved at world size 2 loads at world size 1 bit for bit (weights, optimizer,
  critic and its optimizer; under FSDP2 from the ranks' shard files, joined), and the
  reverse; the resumed second step computes the
  gradients the saving run's own second step computed from that same state, and continues
  AdamW from the checkpoint's optimizer state;
- ``kill -9`` of one rank ends the run with an error naming the rank in under 60 s and
  leaves every checkpoint already written intact; a rank that hangs fails the other's next
  collective after ``trainer.dist_timeout_s`` with an error naming it.

Why gradients and not the weights after the step: the two world sizes sum the same
per-token contributions in another order (each rank its rows, then the all-reduce), so
their gradients differ by float32 rounding. Adam's first step is ``lr * g / (|g| + eps)``:
an entry whose exact gradient is zero or about ``eps`` (embedding rows of tokens that barely
occur, a key bias) turns that rounding into a difference of up to ``2 * lr`` that depends on
the CPU's summation order, not on whether the distribution is right. So the test compares
what the distribution decides, the all-reduced gradient, and checks the optimizer on its
own by replaying AdamW on the recorded gradients.

The gradient tolerance, from the arithmetic (tests/numerics.py): a sum of ``n`` float32
terms computed in any order is within ``gamma_n = n * u / (1 - n * u)`` (``u = 2**-24``) of
the exact sum, relative to the sum of the terms' magnitudes (Higham, *Accuracy and
Stability of Numerical Algorithms*, 2nd ed., section 4.2). Along the longest path into one
gradient entry these runs sum at most 4 rows x 256 tokens, the 262-token vocabulary's
softmax and, in each of 2 layers, widths 32 and 64 and a 256-token attention span: n = 1990,
``gamma_n`` = 1.2e-4, and every tensor's largest gradient difference must stay below that
fraction of the tensor's largest gradient. A wrong reduction is far outside it: summing
where the mean is meant doubles a gradient (relative difference 1), dropping one rank's
micro-batch or the loss scale changes it by order one. Gradient clipping would hide a
wrong factor in the gradients the optimizer sees, so the logged norm before clipping
(``train/grad_norm``, ``critic/grad_norm``) is compared too. Measured on a 2-core AMD EPYC
(AVX2, no AVX-512): at most 5.4e-7 of the tensor's largest gradient, and the replayed AdamW
weights equal the saved ones bit for bit.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from numerics import decoder_gradient_terms, gamma, gradient_differences
from safetensors.torch import load_file

from ardea.trainer.checkpoint import STATE_FILE, checkpoint_problem, list_checkpoints

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
REPO = HERE.parents[1]
CASES = str(HERE / "cases.py")
ALGOS = ("sft", "grpo", "online_grpo", "online_ppo")
RESUMED = ("sft", "online_ppo")  # as in cases.py
MODES = ("fsdp2", "ddp")
#: the runs' model and batch (cases.py): 2 layers of width 32 and 64, the 262-token
#: vocabulary, at most 4 rows of 256 tokens
MODEL = SimpleNamespace(vocab_size=262, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
#: largest gradient difference, relative to the tensor's largest gradient (module docstring)
GRADIENT_RTOL = gamma(decoder_gradient_terms(MODEL, rows=4, span=256))
#: replaying AdamW elementwise on the recorded gradients gives each weight to within a few
#: float32 rounding steps of it (vectorised and scalar loops may fuse multiply-adds
#: differently, and FSDP2 steps on shards): 4 units in the last place
REPLAY_ULPS = 4


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]  # fmt: skip


def run(command: list[str], timeout: float = 300) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


def one_and_two_processes(script: str, root: Path, timeout: float) -> Path:
    """``python SCRIPT ROOT`` in one process, then under torchrun in two: the runs a test
    compares (each script writes under ``ROOT/<world size>``)."""
    run([sys.executable, script, str(root)], timeout=timeout)
    run(torchrun(script, str(root)), timeout=timeout)
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Every run of ``cases.py``: one process, then two (fresh and resumed), then one
    process resuming the two-process checkpoints."""
    root = tmp_path_factory.mktemp("distributed")
    run([sys.executable, CASES, "reference", str(root), "none"])
    run(torchrun(CASES, "fresh+resume", str(root), *MODES))
    run([sys.executable, CASES, "resume", str(root), *MODES])
    return root


def checkpoint(run_dir: Path, step: int) -> Path:
    (path,) = [p for p in list_checkpoints(run_dir) if p.name == f"step_{step:07d}"]
    return path


def weights(path: Path, module: str = "policy") -> dict[str, torch.Tensor]:
    """A checkpoint's ``module`` tensors by the module's own parameter names (the critic's
    head is ``score`` on disk and ``value_head`` in the module)."""
    saved = load_file(str(path / module / "model.safetensors"))
    return {re.sub(r"^score\.", "value_head.", k): v for k, v in saved.items()}


def steps(run_dir: Path, module: str) -> dict[int, dict]:
    """The optimizer steps of ``module`` a run recorded (cases.py), by training step (one
    optimizer step per training step in these runs)."""
    records = torch.load(run_dir / "steps.pt", weights_only=True)
    by_step = {r["step"]: r for r in records if r["module"] == module}
    assert len(by_step) == sum(r["module"] == module for r in records)
    return by_step


def grad_norm(run_dir: Path, module: str, step: int) -> float:
    """The global gradient norm before clipping that the run logged for ``step``."""
    name = {"policy": "train/grad_norm", "critic": "critic/grad_norm"}[module]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (norm,) = [r[name] for r in map(json.loads, lines) if r["step"] == step and name in r]
    return norm


def assert_same_gradients(
    expected: Path, got: Path, module: str, step: int, rtol: float = GRADIENT_RTOL
) -> None:
    """``module``'s gradients at ``step`` of two runs from the same parameters, equal up to
    float32 summation order (module docstring; ``rtol`` for other batches than these runs'):
    the gradients the optimizer stepped with (after clipping) tensor by tensor, and the
    global norm before clipping."""
    first, second = steps(expected, module)[step], steps(got, module)[step]
    assert_same(first["params"], second["params"], "params")
    differences = gradient_differences(first["grads"], second["grads"])
    worst = max(differences, key=differences.get)
    assert differences[worst] <= rtol, (worst, differences[worst])
    norms = grad_norm(expected, module, step), grad_norm(got, module, step)
    assert norms[1] == pytest.approx(norms[0], rel=rtol, abs=0), norms


def replay(records: list[dict]) -> dict[str, torch.Tensor]:
    """The weights a plain single-process AdamW reaches from the first record's parameters
    with the records' gradients and hyperparameters (``records`` start at step 1), fused as
    the trainer's is on CPU."""
    first = records[0]
    params = {n: torch.nn.Parameter(p.clone()) for n, p in first["params"].items()}
    groups = [{"params": [params[n]], **h} for n, h in first["hyper"].items()]
    optimizer = torch.optim.AdamW(groups, fused=True)
    for record in records:
        for group, (name, hyper) in zip(optimizer.param_groups, record["hyper"].items()):
            group.update(hyper)
            grad = record["grads"][name]
            params[name].grad = None if grad is None else grad.clone()
        optimizer.step()
    return {n: p.detach() for n, p in params.items()}


def assert_replayed(records: list[dict], saved: dict[str, torch.Tensor]) -> None:
    """``saved`` (weights a run wrote) is AdamW on ``records``' gradients, to rounding: each
    step's update (at most about lr in size) is computed to a few ulps of itself and then
    added to the weight, so the error is counted in ulps of ``|weight| + lr`` per step (a
    weight near zero would otherwise turn one ulp of its update into hundreds of its own)."""
    replayed = replay(records)
    assert replayed.keys() <= saved.keys()
    for name, value in replayed.items():
        lr = sum(record["hyper"][name]["lr"] for record in records)
        ulp = torch.finfo(torch.float32).eps * (saved[name].abs() + lr).clamp_min(2**-126)
        worst = float(((value - saved[name]).abs() / ulp).max())
        assert worst <= REPLAY_ULPS, (name, worst)


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


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("algo", ALGOS)
def test_one_step_at_two_processes_equals_one_process(runs, algo, mode):
    one, two = runs / "1" / "none" / algo, runs / "2" / mode / algo
    for module in modules(algo):
        assert_same_gradients(one, two, module, 1)
        for run_dir in (one, two):
            assert_replayed([steps(run_dir, module)[1]], weights(checkpoint(run_dir, 1), module))
    # both started from the seeded tiny model, and the step is real: it moved the weights
    # by ~lr, far beyond rounding
    start, initial = steps(one, "policy")[1]["params"], initial_weights(algo)
    assert_same(start, {k: initial[k] for k in start}, "initial weights")
    trained = weights(checkpoint(two, 1))
    assert max(float((trained[k] - start[k]).abs().max()) for k in start) > 1e-4


def with_moments(updater: dict, checkpoint: Path) -> None:
    """Put a sharded (FSDP2) checkpoint's optimizer moments, joined whole, into its trainer
    state's ``updater`` (where a checkpoint written whole has them): each rank's file holds
    its rows of every split tensor, in rank order (FSDP2 splits dimension 0 as
    ``torch.chunk`` does); Adam's step count, a 0-d tensor, is every rank's."""
    files = [load_file(str(f)) for f in sorted((checkpoint / "shards").glob("rank_*"))]
    for name in files[0] if files else ():
        prefix, kind, rest = name.split("/", 2)
        if kind == "optim":
            parameter, key = rest.rsplit("/", 1)
            parts = [f[name] for f in files]
            whole = parts[0] if parts[0].dim() == 0 else torch.cat(parts)
            moments = updater["components"][prefix]["optimizer"]["state"]
            moments.setdefault(parameter, {})[key] = whole


def assert_loaded_exactly(resumed: Path, checkpoint: Path, algo: str) -> None:
    """What the resumed run held after loading ``checkpoint`` is the checkpoint, bit for bit."""
    loaded = torch.load(resumed / "loaded.pt", weights_only=True)
    saved = torch.load(checkpoint / STATE_FILE, weights_only=True)
    with_moments(saved["updater"], checkpoint)
    policy = load_file(str(checkpoint / "policy" / "model.safetensors"))
    assert_same({k: loaded["policy"][k] for k in policy}, policy, "policy")
    assert_same(loaded["updater"], saved["updater"], "updater")
    if algo == "online_ppo":
        critic = load_file(str(checkpoint / "critic" / "model.safetensors"))
        held = {("model." + k[6:] if k.startswith("model.") else "score." + k[11:]): v
                for k, v in loaded["modules"]["critic"].items()}  # fmt: skip
        assert_same(held, critic, "critic")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("algo", RESUMED)
def test_checkpoints_resume_at_the_other_world_size(runs, algo, mode):
    """Step 2 resumed at the other world size from a step-1 checkpoint: the checkpoint
    loaded exactly, the gradients are those the saving run's own step 2 computed from the
    same state, and the weights are AdamW continued from the checkpoint's optimizer state."""
    saved_at_two, saved_at_one = runs / "2" / mode / algo, runs / "1" / "none" / algo
    from_two = runs / "1" / "none" / f"{algo}_from_{mode}"  # saved at 2, resumed at 1
    from_one = runs / "2" / mode / f"{algo}_resumed"  # saved at 1, resumed at 2
    for resumed, saved in ((from_two, saved_at_two), (from_one, saved_at_one)):
        assert_loaded_exactly(resumed, checkpoint(saved, 1), algo)
        for module in modules(algo):
            assert set(steps(resumed, module)) == {2}
            assert_same_gradients(saved, resumed, module, 2)
            history = [steps(saved, module)[1], steps(resumed, module)[2]]
            assert_replayed(history, weights(checkpoint(resumed, 2), module))


@pytest.mark.parametrize("algo", RESUMED)
def test_fsdp2_shard_files_resume_under_ddp(runs, algo):
    """Step 2 under DDP at 2 processes from FSDP2's step-1 checkpoint at 2 (the same world
    size, another layout: the shard files are joined whole, not read as this rank's own):
    loaded exactly, and the FSDP2 run's own step-2 gradients."""
    saved, resumed = runs / "2" / "fsdp2" / algo, runs / "2" / "ddp" / f"{algo}_from_fsdp2"
    assert (checkpoint(saved, 1) / "shards").is_dir()
    assert_loaded_exactly(resumed, checkpoint(saved, 1), algo)
    for module in modules(algo):
        assert set(steps(resumed, module)) == {2}
        assert_same_gradients(saved, resumed, module, 2)


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

"""Two nodes without a shared disk, simulated on this machine: the two commands of
docs/howto/multinode.md (``torchrun --nnodes 2`` with node ranks 0 and 1 on loopback, one
process each, FSDP2), each node with its own run directory, shortened to a tiny model and
4 steps with a checkpoint after each.

- Each node's checkpoints hold that node's rank's shard file only (nothing is shared) and
  the whole run state and Hugging Face export.
- Killed with ``SIGKILL`` (every process of both launches) once both nodes hold the step-2
  checkpoint and relaunched with the same commands, the run resumes on each node from its
  own files and ends with the uninterrupted run's step-4 checkpoint on both nodes, bit for
  bit: weights, Adam moments and export (float32, the same world size: the same sums in
  the same order).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from cases import TINY_MODEL
from safetensors.torch import load_file

from ardea.rollout.engines.vllm.server import free_port
from ardea.trainer.checkpoint import list_checkpoints

pytestmark = pytest.mark.slow

REPO = Path(__file__).parents[2]
PAGE = REPO / "docs" / "howto" / "multinode.md"
PAGE_PORT = "29531"
#: appended to the page's commands: a tiny model, small batches, a checkpoint every step
SHORT = [
    "model.compute_dtype=float32",
    *TINY_MODEL,
    "trainer.batch_size=4",
    "trainer.warmup_steps=0",
    "rollout.group_size=2",
    "rollout.max_new_tokens=6",
    "data.train_size=32",
    "data.eval_size=4",
    "trainer.eval_every=0",
    "trainer.save_every=1",
    "trainer.keep_last=10",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.report=false",
]
STEPS = 4


def page_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S)
    return [line for b in blocks for line in b.splitlines() if line.startswith("torchrun ")]


def node_commands(port: int, steps: int) -> list[list[str]]:
    ardea = str(Path(sys.executable).parent / "ardea")
    commands = []
    for line in page_commands():
        line = line.replace("$(which ardea)", ardea).replace(PAGE_PORT, str(port))
        command = shlex.split(line)
        command[0:1] = [sys.executable, "-m", "torch.distributed.run"]
        commands.append([*command, *SHORT, f"trainer.max_steps={steps}"])
    return commands


def launch(workdir: Path, port: int, steps: int = STEPS) -> list[subprocess.Popen]:
    """Both nodes' commands, run in ``workdir`` (which has the repository's configs/)."""
    workdir.mkdir(exist_ok=True)
    if not (workdir / "configs").exists():
        (workdir / "configs").symlink_to(REPO / "configs")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return [
        subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            text=True,
            stdout=(workdir / f"node{i}.log").open("a"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        for i, command in enumerate(node_commands(port, steps))
    ]


def finish(workdir: Path, launches: list[subprocess.Popen], timeout: float = 300) -> None:
    for i, process in enumerate(launches):
        code = process.wait(timeout=timeout)
        log = (workdir / f"node{i}.log").read_text()
        assert code == 0, log[-4000:]


def kill_every_process(launches: list[subprocess.Popen]) -> None:
    """SIGKILL each launch and every process below it (torchrun's workers run in sessions
    of their own: killing a process group would leave them training)."""
    processes = []
    for launch in launches:
        try:
            processes += [psutil.Process(launch.pid), *psutil.Process(launch.pid).children(recursive=True)]  # fmt: skip
        except psutil.NoSuchProcess:
            pass
    for process in processes:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    for launch in launches:
        launch.wait(timeout=30)


def node_dirs(workdir: Path) -> list[Path]:
    return [workdir / "node0" / "run", workdir / "node1" / "run"]


def tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(checkpoint.rglob("*.safetensors")):
        out |= {f"{file.relative_to(checkpoint)}:{k}": v for k, v in load_file(str(file)).items()}
    return out


def test_the_multinode_page_has_two_node_commands():
    commands = page_commands()
    assert len(commands) == 2 and all("--nnodes 2" in c for c in commands)
    assert [re.search(r"--node-rank (\d)", c).group(1) for c in commands] == ["0", "1"]
    dirs = [re.search(r"trainer.output_dir=(\S+)", c).group(1) for c in commands]
    assert (
        dirs[0] != dirs[1] and not dirs[0].startswith(dirs[1]) and not dirs[1].startswith(dirs[0])
    )


def test_two_nodes_without_a_shared_disk_resume_from_their_own_files(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    finish(straight, launch(straight, free_port()))
    # the same commands, killed once both nodes hold the step-2 checkpoint (run far longer
    # than 4 steps, so that the kill lands before the end), then relaunched with 4 steps
    launches = launch(killed, free_port(), steps=1000)
    deadline = time.monotonic() + 300
    while not all(len(list_checkpoints(d)) >= 2 for d in node_dirs(killed)):
        assert all(p.poll() is None for p in launches), (killed / "node0.log").read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    kill_every_process(launches)
    held = [[p.name for p in list_checkpoints(d)] for d in node_dirs(killed)]
    common = max(set(held[0]) & set(held[1]))
    assert common < f"step_{STEPS:07d}", held  # the kill landed before the last step
    finish(killed, launch(killed, free_port()))
    assert f"resumed from node0/run/checkpoints/{common} at" in (killed / "node0.log").read_text()
    for rank, (expected_dir, resumed_dir) in enumerate(zip(node_dirs(straight), node_dirs(killed))):
        (last,) = [p for p in list_checkpoints(expected_dir) if p.name == f"step_{STEPS:07d}"]
        shards = sorted(p.name for p in (last / "shards").iterdir())
        assert shards == [f"rank_{rank:05d}-of-00002.safetensors"]  # this node's rank alone
        assert (last / "policy" / "model.safetensors").is_file() and (last / "trainer_state.pt").is_file()  # fmt: skip
        expected, got = tensors(last), tensors(resumed_dir / "checkpoints" / last.name)
        assert any(k.startswith("shards/") and "/optim/" in k for k in expected)
        assert expected.keys() == got.keys()
        different = [k for k in expected if not torch.equal(expected[k], got[k])]
        assert not different, different[:5]

"""One process against two under ``torchrun`` on the same work: seconds per training step.

Each run is ``ardea train`` as a user types it, on the same machine, one after the other:
one process with ``trainer.num_threads=2``, then ``torchrun --nproc-per-node 2`` with one
thread per process (gloo; ``--distributed``: ``fsdp2``, the default here, ``ddp``, or
``auto``, which picks DDP for every workload below), the same global batch.
Workloads (the default recipe's model and arithmetic task, float32):

- ``sft``: ``configs/sft_arithmetic.yaml``, batch 64 — each rank trains on half the batch;
- ``online_grpo``: ``configs/online_grpo.yaml``, batch 32 prompts x 8 — each rank generates
  and scores half of the prompts on its own engine, the halves are all-gathered, then both
  train on half of the rows;
- ``online_grpo_kl``: the same with a KL penalty (``algo.ppo.kl_ctl=0.05``), so every step
  pins the frozen reference's log-probs (the ``advantages`` phase): each rank scores half
  of the rows.
- ``online_grpo_10M``: ``online_grpo`` on a 10.4M-parameter decoder (hidden 384,
  intermediate 1152, 6 layers, 6 heads, 2 KV heads; random weights).
- ``online_grpo_vllm``: ``online_grpo`` generating on a vLLM server the run launches
  (``.venv-vllm``; 2 heads: vLLM's CPU attention needs a head dim of 32) — each rank sends
  its half of the requests to it; rank 0 loads the weights. Not in ``--smoke``.

``--recipe`` times the default recipe instead (``ardea train`` with no config: SFT, then
online GRPO with dynamic sampling; evaluation and checkpoints included), one process
against ``torchrun --nproc-per-node 2``, by the wall time of the whole command.

Seconds per step are the run's own profile (``results.json``: training time over steps,
start-up and evaluation excluded), best of ``--repeats``; the phases say where the time
goes.

    python benchmarks/bench_torchrun.py            # the table in benchmarks/README.md
    python benchmarks/bench_torchrun.py --smoke    # 2 steps of a small model each
    python benchmarks/bench_torchrun.py --recipe   # the default recipe, whole
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).parents[1]
ARDEA = str(Path(sys.executable).parent / "ardea")
WORKLOADS = {
    "sft": ["configs/sft_arithmetic.yaml", "trainer.batch_size=64"],
    "online_grpo": ["configs/online_grpo.yaml", "trainer.batch_size=32", "rollout.group_size=8"],
    "online_grpo_kl": ["configs/online_grpo.yaml", "trainer.batch_size=32", "rollout.group_size=8",
                       "algo.ppo.kl_ctl=0.05"],
    "online_grpo_10M": ["configs/online_grpo.yaml", "trainer.batch_size=32", "rollout.group_size=8",
                        "model.hidden_size=384", "model.intermediate_size=1152",
                        "model.num_layers=6", "model.num_heads=6", "model.num_kv_heads=2"],
    "online_grpo_vllm": ["configs/online_grpo.yaml", "trainer.batch_size=32", "rollout.group_size=8",
                         "model.num_heads=2", "model.num_kv_heads=1", "rollout.engine=vllm",
                         "rollout.vllm.launch=true"],
}  # fmt: skip
COMMON = [
    "model.compute_dtype=float32",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "logging.progress=false",
    "logging.tensorboard=false",
]
SMOKE = ["model.hidden_size=32", "model.num_layers=1", "model.intermediate_size=64"]


def run(
    workload: str, processes: int, steps: int, extra: list[str], work: Path, mode: str = "auto"
) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"{workload}_{processes}_", dir=work))
    config, *overrides = WORKLOADS[workload]
    if processes > 1:
        overrides.append(f"trainer.distributed={mode}")
    args = [config, *overrides, *COMMON, *extra, f"trainer.max_steps={steps}",
            f"trainer.output_dir={out}", f"trainer.num_threads={2 // processes}"]  # fmt: skip
    if processes == 1:
        command = [ARDEA, "train", *args]
    else:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command = [*launch, "--nproc-per-node", str(processes), ARDEA, "train", *args]
    env = {**os.environ, "OMP_NUM_THREADS": str(2 // processes)}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stdout[-2000:] + done.stderr[-4000:])
    profile = json.loads((out / "results.json").read_text())["profile"]
    phases = {k: v["seconds_per_step"] for k, v in profile["phases"].items()}
    return {"seconds_per_step": profile["seconds_per_step"], "phases": phases}


def recipe(processes: int, work: Path) -> float:
    """Wall seconds of the default recipe (``ardea train``) at ``processes``."""
    out = Path(tempfile.mkdtemp(prefix=f"recipe_{processes}_", dir=work))
    args = ["logging.progress=false", f"trainer.output_dir={out}"]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              "--nproc-per-node", str(processes)] if processes > 1 else []  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(2 // processes)}
    start = time.perf_counter()
    done = subprocess.run([*launch, ARDEA, "train", *args], cwd=REPO, env=env,
                          capture_output=True, text=True)  # fmt: skip
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(done.stdout[-2000:] + done.stderr[-4000:])
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="2 steps of a 1-layer model, once")
    parser.add_argument(
        "--distributed", default="fsdp2", choices=("fsdp2", "ddp", "auto"),
        help="trainer.distributed of the two-process runs",
    )  # fmt: skip
    parser.add_argument("--recipe", action="store_true", help="the default recipe's wall time")
    args = parser.parse_args()
    if args.recipe:
        with tempfile.TemporaryDirectory() as tmp:
            one, two = recipe(1, Path(tmp)), recipe(2, Path(tmp))
        print(json.dumps({"recipe_one_s": one, "recipe_two_s": two, "two_over_one": two / one}))
        return
    extra = SMOKE if args.smoke else []
    if args.smoke:
        args.steps, args.repeats = 2, 1
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workload in args.workloads:
            best = {}
            for processes in (1, 2):
                runs = [run(workload, processes, args.steps, extra, Path(tmp), args.distributed)
                        for _ in range(args.repeats)]  # fmt: skip
                best[processes] = min(runs, key=lambda r: r["seconds_per_step"])
            row = {"workload": workload, "distributed": args.distributed, "one": best[1],
                   "two": best[2]}  # fmt: skip
            row["two_over_one"] = best[2]["seconds_per_step"] / best[1]["seconds_per_step"]
            print(json.dumps(row))
            rows.append(row)
    print(
        "| workload | 1 process s/step | 2 processes s/step | 2 / 1 | 2 processes: generate s "
        "| pinning (advantages) s: 1 process | 2 processes |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        one, two = r["one"]["phases"], r["two"]["phases"]
        print(f"| {r['workload']} ({r['distributed']}) | {r['one']['seconds_per_step']:.3f} | "
              f"{r['two']['seconds_per_step']:.3f} | {r['two_over_one']:.2f}x | "
              f"{two.get('generate', 0.0):.3f} | {one.get('advantages', 0.0):.3f} | "
              f"{two.get('advantages', 0.0):.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()

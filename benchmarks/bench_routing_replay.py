"""Routing replay (R3) against none: the train–inference mismatch of an MoE policy in bf16.

Runs ``configs/online_grpo.yaml`` (online GRPO on the arithmetic task, in-process engine)
on the tiny Qwen3-MoE (``model.arch=qwen3_moe``: ``--experts`` experts, 2 per token, every
layer sparse) with ``model.compute_dtype=bfloat16``, once with
``algo.moe_routing_replay=false`` and once with ``true``, for each of ``--seeds`` seeds
(``trainer.seed``), ``--steps`` steps each, every step logged. The engine decodes with a
KV cache a step at a time and the trainer runs the whole row: in bf16 the router's scores
differ by rounding, near-ties flip, and a flipped token's log-prob moves with its experts.

Reported per arm, mean ± standard error over seeds of each run's mean over steps: the
``mismatch/*`` metrics (behaviour against trainer log-probs of the trained tokens),
``moe/routing_replay_changed`` (R3 only: the share of replayed token-layer choices the
trainer's router would have made otherwise), the last evaluation's accuracy, and seconds
per step.

    python benchmarks/bench_routing_replay.py             # the table in benchmarks/README.md
    python benchmarks/bench_routing_replay.py --smoke     # 2 steps, one seed
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ardea.config import load_config
from ardea.trainer import Trainer

CONFIG = Path(__file__).parents[1] / "configs" / "online_grpo.yaml"
METRICS = ("mismatch/abs_diff_mean", "mismatch/abs_diff_max", "mismatch/kl_k3",
           "mismatch/ratio_outside", "moe/routing_replay_changed")  # fmt: skip


def run(replay: str, seed: int, args, out: Path) -> dict[str, float]:
    overrides = [
        "model.arch=qwen3_moe", f"model.num_experts={args.experts}",
        "model.compute_dtype=bfloat16", f"algo.moe_routing_replay={replay}",
        f"trainer.seed={seed}", f"trainer.max_steps={args.steps}",
        f"trainer.eval_every={args.steps}", "trainer.save_every=0", "logging.log_every=1",
        "logging.progress=false", "logging.tensorboard=false", "logging.report=false",
        f"trainer.num_threads={args.threads}", f"trainer.output_dir={out}",
    ]  # fmt: skip
    if args.smoke:
        overrides += ["trainer.batch_size=4", "rollout.group_size=2", "data.eval_size=8",
                      "model.hidden_size=32", "model.num_layers=1", "model.intermediate_size=32"]  # fmt: skip
    started = time.perf_counter()
    Trainer(load_config(str(CONFIG), overrides)).train()
    seconds = time.perf_counter() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/loss" in r]
    row = {name: statistics.fmean(r[name] for r in steps) for name in METRICS if name in steps[0]}
    evals = [r["eval/accuracy"] for r in records if "eval/accuracy" in r]
    return row | {"accuracy": evals[-1], "s_per_step": seconds / args.steps}


def mean_se(values: list[float]) -> str:
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return f"{mean:.4g} ± {se:.2g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="2 steps, one seed, a smaller model")
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.steps, args.threads = 1, 2, 1
    torch.set_num_threads(args.threads)
    results: dict[str, list[dict[str, float]]] = {"false": [], "true": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            for replay in results:
                row = run(replay, seed, args, Path(tmp) / f"{replay}_{seed}")
                print(json.dumps({"replay": replay, "seed": seed, **row}))
                results[replay].append(row)
    columns = [*METRICS, "accuracy", "s_per_step"]
    print("| algo.moe_routing_replay | " + " | ".join(c.split("/")[-1] for c in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for replay, rows in results.items():
        cells = [mean_se([r[c] for r in rows]) if c in rows[0] else "–" for c in columns]
        print(f"| {replay} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

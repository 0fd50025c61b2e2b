"""Does RL earn its keep? The default recipe's RL stage against more SFT, at equal time.

For each seed, from the same SFT checkpoint (the default recipe's ``sft`` stage: the tiny
model trained from scratch on its small fixed set of demonstrations):

- **rl**: the default recipe's ``rl`` stage (online GRPO on fresh prompts, scored by the
  task's verifier), as ``ardea train`` runs it;
- **sft-continued**: SFT on the *same* demonstrations, for the same training wall-clock time
  as the RL arm took (``trainer.max_train_seconds``; evaluations not counted on either side),
  once with the SFT stage's own schedule restarted (peak lr, warm-up, cosine over the steps
  that fit in that time at the SFT stage's measured pace) and once at a constant learning
  rate equal to where the SFT stage's schedule ended.

Reported per seed and arm: steps, training seconds, held-out exact-match accuracy (greedy,
the task's held-out split) at the start and the end. The script exits with status 1 when,
for any seed, the RL arm does not end above every SFT-continued arm.

    python benchmarks/bench_rl_vs_sft.py                      # seeds 0 1 2 (about 7 min per seed on 2 cores)
    python benchmarks/bench_rl_vs_sft.py --seeds 0 --out /tmp/rl_vs_sft
    python benchmarks/bench_rl_vs_sft.py --smoke      # seconds: seed 0, a few steps, exit 0
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

import torch
from recipe_bench import SMOKE_RL, SMOKE_SFT

from ardea.config import DEFAULT_RECIPE, load_config, stage_configs
from ardea.trainer import Trainer

SMOKE = [*SMOKE_SFT, *SMOKE_RL]  # a few steps of each arm


def stages(seed: int, extra: list[str]) -> dict:
    config = load_config(DEFAULT_RECIPE, [f"trainer.seed={seed}", "logging.progress=false", *extra])
    return dict(stage_configs(config))


def run_arm(config, output_dir: Path, **fields) -> dict:
    config.trainer.output_dir = str(output_dir)
    config.trainer.resume = "auto"  # a rerun of the benchmark reuses finished arms
    for dotted, value in fields.items():
        section, name = dotted.split("__")
        setattr(getattr(config, section), name, value)
    return Trainer(config).train()


def bench_seed(seed: int, out: Path, extra: list[str]) -> list[dict]:
    root = out / f"seed_{seed}"
    sft = run_arm(stages(seed, extra)["sft"], root / "sft")
    start = sft["checkpoint"]
    rows = []
    rl = run_arm(stages(seed, extra)["rl"], root / "rl", model__path=start)
    rows.append(("rl", rl))
    budget = rl["train_seconds"]
    # the SFT stage's own pace sets the horizon of the restarted schedule; the time budget
    # still ends the arm (whichever comes first)
    horizon = max(1, int(budget * sft["steps"] / max(sft["train_seconds"], 1e-9)))
    base = stages(seed, extra)["sft"]
    final_lr = base.trainer.lr * base.trainer.min_lr_ratio
    variants = {
        "sft-continued (schedule restarted)": {},
        f"sft-continued (constant lr {final_lr:g})": {
            "trainer__lr": final_lr,
            "trainer__lr_schedule": "constant",
            "trainer__warmup_steps": 0,
        },
    }
    for i, (name, fields) in enumerate(variants.items()):
        config = stages(seed, extra)["sft"]
        result = run_arm(
            config,
            root / f"sft_continued_{i}",
            model__path=start,
            trainer__max_steps=horizon,
            trainer__max_train_seconds=budget,
            trainer__eval_every=0,
            **fields,
        )
        rows.append((name, result))
    return [
        {
            "seed": seed,
            "arm": name,
            "steps": r["steps"],
            "train_seconds": r["train_seconds"],
            "accuracy_start": r["accuracy_initial"],
            "accuracy_end": r["accuracy"],
        }
        for name, r in rows
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_rl_vs_sft"))
    parser.add_argument("overrides", nargs="*", help="overrides of the default recipe")
    parser.add_argument("--smoke", action="store_true", help="seed 0, a few steps; exit 0")
    args = parser.parse_args()
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="bench_rl_vs_sft-") as out:
            report(bench_seed(0, Path(out), [*SMOKE, *args.overrides]), [0])
        return 0
    rows = [row for seed in args.seeds for row in bench_seed(seed, args.out, args.overrides)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    return report(rows, args.seeds)


def report(rows: list[dict], seeds: list[int]) -> int:
    """Print the table; 1 unless RL ended above every SFT-continued arm for every seed."""
    print(f"\n{platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    print("| seed | arm | steps | train s | accuracy start | accuracy end | change |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        change = 100 * (r["accuracy_end"] - r["accuracy_start"])
        print(
            f"| {r['seed']} | {r['arm']} | {r['steps']} | {r['train_seconds']:.0f} | "
            f"{r['accuracy_start']:.1%} | {r['accuracy_end']:.1%} | {change:+.1f} pts |"
        )
    failed = []
    for seed in seeds:
        arms = [r for r in rows if r["seed"] == seed]
        rl = next(r for r in arms if r["arm"] == "rl")
        best_sft = max(r["accuracy_end"] for r in arms if r["arm"] != "rl")
        if rl["accuracy_end"] <= best_sft:
            failed.append(seed)
    if failed:
        print(f"RL did not beat SFT-continued at equal time for seeds {failed}")
        return 1
    print("RL beat every SFT-continued arm at equal training time for every seed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

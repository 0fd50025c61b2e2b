"""A learned reward model, then GRPO against it: does the policy get better by the verifier?

``configs/reward_model_grpo.yaml`` as ``ardea train`` runs it (SFT on the sloppy
demonstrations; a Bradley–Terry reward model on the arithmetic task's built-in preference
pairs, from the SFT policy; online GRPO from the SFT policy against the reward model's
score), and beside it, from the same SFT checkpoint, the same RL stage with the task's
verifier as the reward (what the default recipe does). The held-out accuracy each reports
is the verifier's in both arms, so a policy that pleases the reward model without solving
the sums shows as a fall.

Reported per seed: the reward model's held-out pair accuracy, and per arm the steps and the
held-out accuracy at the start, at each evaluation and at the end.

    python benchmarks/bench_reward_model.py                   # seed 0 (about 6 min on 2 cores)
    python benchmarks/bench_reward_model.py --seeds 0 1 2
    python benchmarks/bench_reward_model.py --smoke    # seconds: a few steps of each stage
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from recipe_bench import SMALLEST_MODEL, SMOKE_SFT, curve, print_machine, save_rows

from ardea.config import load_config, stage_configs
from ardea.trainer import Trainer, run

REPO = Path(__file__).parents[1]
RECIPE = REPO / "configs" / "reward_model_grpo.yaml"
SMOKE = [  # a few steps of each stage
    *SMOKE_SFT,
    SMALLEST_MODEL,
    "stages.rm.data.train_size=32",
    "stages.rm.data.eval_size=8",
    "stages.rm.trainer.max_steps=2",
    "stages.rm.trainer.batch_size=8",
    "stages.rl.trainer.max_steps=2",
    "stages.rl.trainer.batch_size=4",
    "stages.rl.trainer.eval_every=1",
    "stages.rl.trainer.save_every=0",
]


def bench_seed(seed: int, out: Path, extra: list[str]) -> dict:
    root = out / f"seed_{seed}"
    overrides = [f"trainer.seed={seed}", "logging.progress=false", "trainer.resume=auto", *extra]
    staged = run(load_config(RECIPE, [*overrides, f"trainer.output_dir={root / 'recipe'}"]))
    # the verifier arm: the recipe's RL stage, its reward the task's verifier
    config = load_config(RECIPE, [*overrides, "stages.rl.reward.functions=[{name: task}]"])
    rl = dict(stage_configs(config))["rl"]
    rl.model.path = staged["sft"]["checkpoint"]
    rl.trainer.output_dir = str(root / "verifier")
    Trainer(rl).train()
    return {
        "seed": seed,
        "rm_accuracy": staged["rm"]["rm_accuracy"],
        "arms": {
            "reward model": curve(root / "recipe" / "rl"),
            "verifier": curve(root / "verifier"),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_reward_model"))
    parser.add_argument("overrides", nargs="*", help="overrides of the recipe")
    parser.add_argument("--smoke", action="store_true", help="a few steps of each stage")
    args = parser.parse_args()
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="bench_reward_model-") as out:
            report([bench_seed(0, Path(out), [*SMOKE, *args.overrides])])
        return 0
    rows = [bench_seed(seed, args.out, args.overrides) for seed in args.seeds]
    save_rows(args.out, rows)
    report(rows)
    return 0


def report(rows: list[dict]) -> None:
    print_machine()
    print(
        "| seed | RM held-out accuracy | RL reward | accuracy start | accuracy end | evaluations |"
    )
    print("|---:|---:|---|---:|---:|---|")
    for r in rows:
        for arm, points in r["arms"].items():
            shown = ", ".join(f"{step}: {acc:.0%}" for step, acc in points)
            print(
                f"| {r['seed']} | {r['rm_accuracy']:.1%} | {arm} | {points[0][1]:.1%} | "
                f"{points[-1][1]:.1%} | {shown} |"
            )


if __name__ == "__main__":
    raise SystemExit(main())

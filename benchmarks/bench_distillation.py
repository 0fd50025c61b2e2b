"""On-policy distillation against GRPO, at equal training time, over seeds.

The teacher is the default recipe's final (RL'd) model: ``--teacher DIR``, or the default
recipe run here first (seed 0). The student is ``configs/distill.yaml``'s smaller model after
its ``sft`` stage (trained once, seed 0: the same start for every arm). From that start,
for each seed, three arms of ``configs/distill.yaml``'s ``distill`` stage run for the same
training wall-clock time (``trainer.max_train_seconds``; evaluations not counted):

- **grpo**: the task's verifier as the reward (weight 1), no teacher, with dynamic
  sampling (the default recipe's RL stage settings);
- **distill**: the teacher's per-token reward only (the verifier logged at weight 0);
- **both**: the teacher's per-token reward and the verifier's (weight 1).

Reported per seed and arm: steps, training seconds, held-out exact-match accuracy (greedy,
the task's held-out split) at the start, at each evaluation and at the end, and the mean
over seeds of the end accuracy.

    python benchmarks/bench_distillation.py                      # seeds 0 1 2, 90 s per arm
    python benchmarks/bench_distillation.py --teacher runs/default/rl/checkpoints/best/policy
    python benchmarks/bench_distillation.py --smoke      # seconds: seed 0, a few steps
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from recipe_bench import SMALLEST_MODEL, SMOKE_RL, SMOKE_SFT, curve, print_machine, save_rows

from ardea.config import DEFAULT_RECIPE, load_config, stage_configs
from ardea.trainer import Trainer, run

REPO = Path(__file__).parents[1]
RECIPE = REPO / "configs" / "distill.yaml"
SMOKE = [*SMOKE_SFT, SMALLEST_MODEL]  # a few steps of everything
SMOKE_TEACHER = [*SMOKE, *SMOKE_RL]
SMOKE_ARM = [  # ... and of each arm
    "stages.distill.trainer.batch_size=4",
    "stages.distill.trainer.eval_every=2",
    "stages.distill.rollout.group_size=2",
]
ARMS = {
    "grpo": {"teacher": None, "weight": 1.0, "dynamic": True},
    "distill": {"teacher": True, "weight": 0.0, "dynamic": False},
    "both": {"teacher": True, "weight": 1.0, "dynamic": False},
}


def teacher_model(out: Path, extra: list[str]) -> str:
    """The default recipe's final model, trained here (resumed if done already)."""
    overrides = ["logging.progress=false", f"trainer.output_dir={out / 'teacher'}",
                 "trainer.resume=auto", *extra]  # fmt: skip
    return run(load_config(DEFAULT_RECIPE, overrides))["checkpoint"]


def recipe_stages(seed: int, extra: list[str]) -> dict:
    config = load_config(RECIPE, [f"trainer.seed={seed}", "logging.progress=false", *extra])
    return dict(stage_configs(config))


def train(config, output_dir: Path) -> dict:
    config.trainer.output_dir = str(output_dir)
    config.trainer.resume = "auto"  # a rerun of the benchmark reuses finished runs
    return Trainer(config).train()


def bench(seeds: list[int], out: Path, teacher: str, budget: float, extra: list[str]) -> list:
    student = train(recipe_stages(0, extra)["sft"], out / "student_sft")["checkpoint"]
    rows = []
    for seed in seeds:
        for name, arm in ARMS.items():
            config = recipe_stages(seed, extra)["distill"]
            config.model.path = student
            config.algo.teacher.path = teacher if arm["teacher"] else None
            config.reward.functions[0].weight = arm["weight"]
            config.algo.dynamic_sampling = arm["dynamic"]
            config.trainer.max_steps = 100_000
            config.trainer.max_train_seconds = budget
            config.trainer.save_every = 0
            directory = out / f"seed_{seed}" / name
            result = train(config, directory)
            rows.append(
                {
                    "seed": seed,
                    "arm": name,
                    "steps": result["steps"],
                    "train_seconds": result["train_seconds"],
                    "accuracy_start": result["accuracy_initial"],
                    "accuracy_end": result["accuracy"],
                    "curve": curve(directory),
                }
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seconds", type=float, default=90.0, help="training time per arm")
    parser.add_argument("--teacher", help="the teacher's model directory (default: train it)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_distillation"))
    parser.add_argument("overrides", nargs="*", help="overrides of configs/distill.yaml")
    parser.add_argument("--smoke", action="store_true", help="seed 0, a few steps")
    args = parser.parse_args()
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="bench_distillation-") as out:
            teacher = teacher_model(Path(out), SMOKE_TEACHER)
            rows = bench([0], Path(out), teacher, 2.0, [*SMOKE, *SMOKE_ARM, *args.overrides])
        report(rows)
        return 0
    teacher = args.teacher or teacher_model(args.out, [])
    rows = bench(args.seeds, args.out, teacher, args.seconds, args.overrides)
    save_rows(args.out, rows)
    report(rows)
    return 0


def report(rows: list[dict]) -> None:
    print_machine()
    print("| seed | arm | steps | train s | accuracy start | accuracy end | evaluations |")
    print("|---:|---|---:|---:|---:|---:|---|")
    for r in rows:
        points = ", ".join(f"{step}: {acc:.0%}" for step, acc in r["curve"])
        print(
            f"| {r['seed']} | {r['arm']} | {r['steps']} | {r['train_seconds']:.0f} | "
            f"{r['accuracy_start']:.1%} | {r['accuracy_end']:.1%} | {points} |"
        )
    print("| arm | mean accuracy end | min | max |")
    print("|---|---:|---:|---:|")
    for name in ARMS:
        ends = [r["accuracy_end"] for r in rows if r["arm"] == name]
        print(f"| {name} | {statistics.mean(ends):.1%} | {min(ends):.1%} | {max(ends):.1%} |")


if __name__ == "__main__":
    raise SystemExit(main())

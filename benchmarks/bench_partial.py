"""Partial rollouts off against on, on the same work and seeds: seconds per step, generated
tokens per second, how long the trainer waited for generation, and the learning curve.

Each run is ``ardea train`` as a user types it, one after the other on the same machine:
``configs/online_grpo.yaml`` (the default recipe's model and arithmetic task, float32) with
background rollouts (``rollout.max_staleness=1``) and a long ``rollout.max_new_tokens``, so
completion lengths have a long tail (a completion ends at its stop token, most early, a few
at the limit). ``off``: ``rollout.partial=false`` (each step's completions from one version;
the worker loads a version between jobs); ``on``: ``rollout.partial=true`` (versions loaded
in flight, completions resumed under them, the next step's rows decoded beside the tail).

Per run: seconds per step (the run's own profile: training time over steps), the mean of
``perf/time_generate`` (the trainer's wait for its rollout), ``perf/generate_tokens_per_s``
(the worker's throughput), ``rollout/resumed_fraction``, and the mean reward and accuracy of
the first and last quarter of the steps.

    python benchmarks/bench_partial.py            # the table in benchmarks/README.md
    python benchmarks/bench_partial.py --smoke    # 2 steps of a small model each
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).parents[1]
ARDEA = str(Path(sys.executable).parent / "ardea")
COMMON = [
    "configs/online_grpo.yaml",
    "model.compute_dtype=float32",
    "rollout.max_staleness=1",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.log_every=1",
    "trainer.num_threads=2",
]
MODES = {"off": ["rollout.partial=false"], "on": ["rollout.partial=true"]}
SMOKE = ["model.hidden_size=32", "model.num_layers=1", "model.intermediate_size=64"]


def run(mode: str, steps: int, extra: list[str], work: Path) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"partial_{mode}_", dir=work))
    args = [
        *COMMON,
        *MODES[mode],
        *extra,
        f"trainer.max_steps={steps}",
        f"trainer.output_dir={out}",
    ]
    done = subprocess.run([ARDEA, "train", *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stdout[-2000:] + done.stderr[-4000:])
    profile = json.loads((out / "results.json").read_text())["profile"]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if "rollout/reward_mean" in r]
    quarter = max(1, len(records) // 4)

    def mean(key: str, part: list[dict]) -> float:
        return sum(r.get(key, 0.0) for r in part) / len(part)

    return {
        "mode": mode,
        "seconds_per_step": profile["seconds_per_step"],
        "wait_s": mean("perf/time_generate", records),
        "tokens_per_s": mean("perf/generate_tokens_per_s", records),
        "resumed_fraction": mean("rollout/resumed_fraction", records),
        "response_length": mean("rollout/response_length", records),
        "reward_first": mean("rollout/reward_mean", records[:quarter]),
        "reward_last": mean("rollout/reward_mean", records[-quarter:]),
        "accuracy_first": mean("rollout/accuracy", records[:quarter]),
        "accuracy_last": mean("rollout/accuracy", records[-quarter:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--smoke", action="store_true", help="2 steps of a 1-layer model")
    args = parser.parse_args()
    extra = [f"rollout.max_new_tokens={args.max_new_tokens}"]
    if args.smoke:
        args.steps, extra = 2, [*extra, *SMOKE, "trainer.num_threads=1"]
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(mode, args.steps, extra, Path(tmp)) for mode in MODES]
    for row in rows:
        print(json.dumps(row))
    off, on = rows
    print("| partial | s/step | trainer wait s/step | tokens/s | resumed | length | "
          "reward first → last quarter | accuracy first → last |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['seconds_per_step']:.3f} | {r['wait_s']:.3f} | "
              f"{r['tokens_per_s']:.0f} | {r['resumed_fraction']:.2f} | "
              f"{r['response_length']:.1f} | {r['reward_first']:.3f} → {r['reward_last']:.3f} | "
              f"{r['accuracy_first']:.3f} → {r['accuracy_last']:.3f} |")  # fmt: skip
    print(f"on / off seconds per step: {on['seconds_per_step'] / off['seconds_per_step']:.2f}")


if __name__ == "__main__":
    main()

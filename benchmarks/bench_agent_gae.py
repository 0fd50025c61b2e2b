"""Turn-level against token-level GAE for multi-turn PPO: same environment, same SFT start,
same budget, held-out success after RL.

    python benchmarks/bench_agent_gae.py                 # configs/agent_guess_number.yaml, seeds 0 1 2
    python benchmarks/bench_agent_gae.py --seeds 0       # one seed
    python benchmarks/bench_agent_gae.py --smoke         # seconds: a few steps, no verdict

For each seed the config's SFT stage runs once; its policy starts two RL runs that differ
only in ``algo.ppo.gae_timestep_unit`` (``token``: one GAE step per generated token;
``turn``: one per assistant turn, the critic's value taken at each turn's first token),
with the config's λ (VAPO's length-adaptive λ = 1 − 1/(α·L), L the token or turn count).
Reported: held-out success rate (the config's evaluation: ``agent.eval_episodes`` sampled
games per target, the same seed for both arms) before and after RL, and the training wall
time of each arm. The verdict says which unit won on the mean over seeds;
a tie is reported as such. Runs write under ``--workdir`` (a temporary directory by
default, removed afterwards).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
from pathlib import Path

from ardea.config import load_config, stage_configs
from ardea.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
QUIET = ["logging.progress=false", "logging.tensorboard=false", "trainer.save_every=0"]
SMOKE = [
    "stages.sft.trainer.max_steps=4",
    "stages.rl.trainer.max_steps=2",
    "stages.rl.trainer.eval_every=0",
    "stages.rl.trainer.batch_size=2",
    "stages.sft.trainer.batch_size=4",
    "rollout.group_size=2",
    "data.train_size=32",
    "data.eval_size=4",
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.intermediate_size=32",
]


def arms(config_path: str, seed: int, workdir: Path, extra: list[str]) -> dict[str, dict]:
    """The SFT stage once, then RL with each timestep unit from its policy."""
    config = load_config(config_path, [f"trainer.seed={seed}", *QUIET, *extra])
    (_, sft), (_, rl) = stage_configs(config)
    sft.trainer.output_dir = str(workdir / f"seed{seed}" / "sft")
    start = Trainer(sft).train()["checkpoint"]
    out = {}
    for unit in ("token", "turn"):
        arm = copy.deepcopy(rl)
        arm.model.path = start
        arm.algo.ppo.gae_timestep_unit = unit
        arm.trainer.output_dir = str(workdir / f"seed{seed}" / unit)
        result = Trainer(arm).train()
        out[unit] = {
            "before": result["success_initial"],
            "after": result["success"],
            "train_seconds": result["train_seconds"],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "agent_guess_number.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--threads", type=int, default=1, help="trainer.num_threads")
    parser.add_argument("--smoke", action="store_true", help="a few steps, seed 0; no verdict")
    args = parser.parse_args()
    extra = [f"trainer.num_threads={args.threads}"] + (SMOKE if args.smoke else [])
    seeds = [0] if args.smoke else args.seeds
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.workdir or tmp)
        results = {s: arms(args.config, s, workdir, extra) for s in seeds}
    print("| seed | unit | success before RL | success after RL | train s |")
    print("|---|---|---|---|---|")
    for seed, by_unit in results.items():
        for unit, r in by_unit.items():
            print(
                f"| {seed} | {unit} | {r['before']:.3f} | {r['after']:.3f} | {r['train_seconds']} |"
            )
    means = {u: statistics.mean(results[s][u]["after"] for s in seeds) for u in ("token", "turn")}
    print(json.dumps({"mean_success_after_rl": means}))
    if not args.smoke:
        if means["turn"] == means["token"]:
            print("verdict: a tie (same mean held-out success)")
        else:
            winner = max(means, key=means.get)
            print(
                f"verdict: {winner}-level GAE wins ({means[winner]:.3f} vs {min(means.values()):.3f})"
            )


if __name__ == "__main__":
    main()

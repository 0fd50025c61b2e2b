"""The default recipe (``ardea train`` without a config: SFT on scarce, sloppy
demonstrations, then online GRPO) with a shortened RL stage, through the real CLI, then
``ardea eval`` on its run."""

import json
import re

import pytest
from cli_testing import ardea

from ardea.trainer.metrics_log import read_metrics

pytestmark = pytest.mark.slow

# the recipe's own SFT stage (1,600 steps: the sloppy demonstrator's ~50 % on every seed the
# grid measured); 50 RL steps of the 200 are enough to remove most of its mistake (the grid's
# runs were at 100 % by step 50), evaluated on 200 held-out problems
SHORT = [
    "data.eval_size=200",
    "logging.progress=false",
    "stages.rl.trainer.max_steps=50",
    "stages.rl.trainer.eval_every=25",
]


def test_shortened_default_recipe(tmp_path):
    run_dir = tmp_path / "run"
    out = ardea("train", *SHORT, f"trainer.output_dir={run_dir}", cwd=tmp_path).stdout
    assert "accuracy_before_rl" in out and "accuracy_after_rl" in out  # the final table
    results = json.loads((run_dir / "results.json").read_text())
    before, after = results["accuracy_before_rl"], results["accuracy_after_rl"]
    assert results["stages"] == ["sft", "rl"]
    stage_seconds = results["sft"]["wall_seconds"] + results["rl"]["wall_seconds"]
    assert results["wall_seconds"] >= stage_seconds - 0.2  # the whole run spans both stages
    assert results["sft"]["strategy"] == "sft" and results["rl"]["strategy"] == "online_grpo"
    # RL stops at the first evaluation (every 25 steps) with 99 % held-out accuracy, or at 50
    rl_steps = results["rl"]["steps"]
    assert results["sft"]["steps"] == 1600 and rl_steps in (25, 50)
    if rl_steps < 50:
        assert results["rl"]["stopped_early"]["step"] == rl_steps and after >= 0.99
    else:
        assert "stopped_early" not in results["rl"] or after >= 0.99
    assert before == results["sft"]["accuracy"]  # RL starts from the SFT stage's final policy
    # SFT imitates a demonstrator who drops the top carry three times in four: it answers
    # roughly the half of the problems without one; RL on the verifier's reward fixes that
    assert 0.3 < before < 0.7, before
    assert after > before + 0.25, (before, after)
    assert results["rl"]["best_checkpoint"].startswith(str(run_dir / "rl" / "checkpoints" / "best"))
    for stage in ("sft", "rl"):
        for name in ("config.yaml", "metrics.jsonl", "results.json", "report.png"):
            assert (run_dir / stage / name).is_file(), (stage, name)
    sft_records = read_metrics(run_dir / "sft" / "metrics.jsonl")
    losses = [r["train/loss"] for r in sft_records if "train/loss" in r]
    assert losses[-1] < 0.5 * losses[0]  # the SFT stage learned from its demonstrations
    records = read_metrics(run_dir / "rl" / "metrics.jsonl")
    evaluations = [(r["step"], r["eval/accuracy"]) for r in records if "eval/accuracy" in r]
    assert [step for step, _ in evaluations] == list(range(0, rl_steps + 1, 25))
    assert all(value < 0.99 for _, value in evaluations[:-1])  # it stopped at the first one
    assert any("rollout/reward_mean" in r and "rollout/accuracy" in r for r in records)
    # `ardea eval` on the run directory evaluates the last stage's final policy: the same
    # greedy answers on the same held-out prompts as the run's own last evaluation
    evaluated = ardea("eval", str(run_dir), "data.eval_size=200", cwd=tmp_path).stdout
    shown = re.search(r"accuracy\s*│\s*([\d.]+)%", evaluated)
    assert shown is not None, evaluated
    assert float(shown.group(1)) / 100 == pytest.approx(after, abs=1e-9)
    (run_dir / "report.png").unlink()
    reported = ardea("report", str(run_dir), cwd=tmp_path).stdout
    # each stage's report.png, the RL stage's trajectories.html, the overview
    assert reported.count("wrote") == 4 and (run_dir / "report.png").is_file()
    assert "trajectories.html" in "".join(reported.split())  # (rich wraps long paths)
    assert (run_dir / "rl" / "trajectories.html").is_file()

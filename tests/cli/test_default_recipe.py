"""A shortened default recipe (``ardea train`` without a config: SFT on scarce
demonstrations, then online GRPO) through the real CLI, then ``ardea eval`` on its run."""

import json
import re

import pytest
from cli_testing import ardea

from ardea.trainer.metrics_log import read_metrics

pytestmark = pytest.mark.slow

# 2-digit sums: 400 SFT steps reach ~45 % held-out accuracy, and 100 RL steps are enough to
# see RL's gain (it dips first, then climbs above the SFT policy)
SHORT = [
    "data.eval_size=200",
    "data.task_args.digits=2",
    "trainer.num_threads=1",
    "logging.progress=false",
    "stages.sft.trainer.max_steps=400",
    "stages.rl.trainer.max_steps=100",
    "stages.rl.trainer.eval_every=50",
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
    assert results["sft"]["steps"] == 400 and results["rl"]["steps"] == 100
    assert before == results["sft"]["accuracy"]  # RL starts from the SFT stage's final policy
    assert after > before + 0.03, (before, after)  # RL improved on the SFT policy
    for stage in ("sft", "rl"):
        for name in ("config.yaml", "metrics.jsonl", "results.json", "report.png"):
            assert (run_dir / stage / name).is_file(), (stage, name)
    sft_records = read_metrics(run_dir / "sft" / "metrics.jsonl")
    losses = [r["train/loss"] for r in sft_records if "train/loss" in r]
    assert losses[-1] < 0.5 * losses[0]  # the SFT stage learned from its demonstrations
    records = read_metrics(run_dir / "rl" / "metrics.jsonl")
    assert [r["step"] for r in records if "eval/accuracy" in r] == [0, 50, 100]
    assert any("rollout/reward_mean" in r and "rollout/accuracy" in r for r in records)
    # `ardea eval` on the run directory evaluates the last stage's final policy: the same
    # greedy answers on the same held-out prompts as the run's own last evaluation
    evaluated = ardea(
        "eval", str(run_dir), "data.eval_size=200", "data.task_args.digits=2", cwd=tmp_path
    ).stdout
    shown = re.search(r"accuracy\s*│\s*([\d.]+)%", evaluated)
    assert shown is not None, evaluated
    assert float(shown.group(1)) / 100 == pytest.approx(after, abs=1e-9)
    (run_dir / "report.png").unlink()
    reported = ardea("report", str(run_dir), cwd=tmp_path).stdout
    assert reported.count("wrote") == 3 and (run_dir / "report.png").is_file()

"""A shortened default recipe (``ardea train`` without a config: SFT on scarce
demonstrations, then online GRPO) through the real CLI, then ``ardea eval`` on its run."""

import json
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SHORT = [
    "data.eval_size=100",
    "trainer.num_threads=1",
    "logging.progress=false",
    "stages.sft.trainer.max_steps=300",
    "stages.rl.trainer.max_steps=12",
    "stages.rl.trainer.eval_every=6",
]


def ardea(*args, cwd):
    result = subprocess.run(
        [sys.executable, "-m", "ardea.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_shortened_default_recipe(tmp_path):
    run_dir = tmp_path / "run"
    out = ardea("train", *SHORT, f"trainer.output_dir={run_dir}", cwd=tmp_path).stdout
    assert "accuracy_before_rl" in out and "accuracy_after_rl" in out  # the final table
    results = json.loads((run_dir / "results.json").read_text())
    before, after = results["accuracy_before_rl"], results["accuracy_after_rl"]
    assert 0.0 <= before <= 1.0 and 0.0 <= after <= 1.0
    assert results["wall_seconds"] > 0 and results["stages"] == ["sft", "rl"]
    assert results["sft"]["strategy"] == "sft" and results["rl"]["strategy"] == "online_grpo"
    assert results["sft"]["steps"] == 300 and results["rl"]["steps"] == 12
    assert before == results["sft"]["accuracy"]  # RL starts from the SFT stage's final policy
    for stage in ("sft", "rl"):
        for name in ("config.yaml", "metrics.jsonl", "results.json", "report.png"):
            assert (run_dir / stage / name).is_file(), (stage, name)
    records = [json.loads(x) for x in (run_dir / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval/accuracy" in r] == [0, 6, 12]
    assert any("rollout/reward_mean" in r and "rollout/accuracy" in r for r in records)
    # `ardea eval` on the run directory evaluates the last stage's final policy: the same
    # greedy answers on the same held-out prompts as the run's own last evaluation
    evaluated = ardea("eval", str(run_dir), "data.eval_size=100", cwd=tmp_path).stdout
    shown = re.search(r"accuracy\s*│\s*([\d.]+)%", evaluated)
    assert shown is not None, evaluated
    assert float(shown.group(1)) / 100 == pytest.approx(after, abs=1e-9)
    (run_dir / "report.png").unlink()
    reported = ardea("report", str(run_dir), cwd=tmp_path).stdout
    assert reported.count("wrote") == 3 and (run_dir / "report.png").is_file()

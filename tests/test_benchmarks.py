"""Every benchmark script runs in its smoke mode (seconds, one torch thread) against the
installed package; the figures are not checked, what the scripts compute from them is."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("bench_*.py"))


def smoke(script: str, *args: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--smoke", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_every_benchmark_has_a_smoke_test():
    assert SCRIPTS == [
        "bench_gae.py",
        "bench_grpo_vs_trl.py",
        "bench_rl_vs_sft.py",
        "bench_rollout.py",
    ]


def test_gae_smoke(tmp_path):
    out = smoke("bench_gae.py", cwd=tmp_path)
    assert "bit-exact vs python loop f32 and seed column loop (rtol=0, atol=0): True" in out


def test_rollout_smoke(tmp_path):
    rows = smoke("bench_rollout.py", cwd=tmp_path).splitlines()
    cells = [line.split(" | ")[:3] for line in rows if line.startswith("| 4 |")]
    assert cells == [["| 4", "8", mode] for mode in ("sample", "greedy", "sample+stop")]


def test_rl_vs_sft_smoke(tmp_path):
    out = smoke("bench_rl_vs_sft.py", cwd=tmp_path)
    arms = [line.split(" | ")[1] for line in out.splitlines() if line.startswith("| 0 |")]
    assert arms[0] == "rl" and len(arms) == 3
    assert not (tmp_path / "runs").exists()  # smoke runs leave nothing behind


def test_grpo_vs_trl_smoke_never_creates_the_trl_environment(tmp_path):
    venv = tmp_path / "venv-trl"
    cases = ["--cases", "fp32+ref", "realistic"]
    out = smoke("bench_grpo_vs_trl.py", "--trl-venv", str(venv), *cases, cwd=tmp_path)
    assert f"# TRL side skipped: no TRL environment at {venv} (smoke mode)" in out
    assert not venv.exists()
    row, realistic = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    # the realistic case: the recipe's SFT stage (shortened) ran, completions end at EOS
    assert realistic["case"] == "realistic" and realistic["flops_per_step"] is None
    assert 1 <= realistic["ardea_completion_tokens"] <= 8
    assert row["case"] == "fp32+ref" and len(row["ardea_steps"]) == 1
    assert row["ardea_precision"] == "fp32" and row["ardea_completion_tokens"] == 8
    assert row["ardea_s_per_step"] > 0 and "trl_s_per_step" not in row
    # by hand, smoke shape: H 32, I 64, L 2, 2 heads of 16 (one KV head: H_kv 16), V 262,
    # 2 prompts × 2 completions of P 6 + R 8 tokens, with the reference (4 forwards)
    m = 2 * (2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64) + 262 * 32  # 26,816

    def forward(s):
        return 2 * m * s + 2 * 2 * 32 * s * (s + 1)

    assert row["flops_per_step"] == 4 * (forward(13) + 4 * forward(14)) == 15_325_696
    assert row["ardea_gflops"] == pytest.approx(
        row["flops_per_step"] / row["ardea_s_per_step"] / 1e9
    )

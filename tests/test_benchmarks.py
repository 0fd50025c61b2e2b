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
        "bench_agent_gae.py",
        "bench_agent_rollout.py",
        "bench_agent_turns.py",
        "bench_compile.py",
        "bench_compute_dtype.py",
        "bench_distillation.py",
        "bench_gae.py",
        "bench_grpo_vs_trl.py",
        "bench_logprob_memory.py",
        "bench_lora_sync.py",
        "bench_mismatch.py",
        "bench_partial.py",
        "bench_reward_model.py",
        "bench_rl_vs_sft.py",
        "bench_rollout.py",
        "bench_routing_replay.py",
        "bench_torchrun.py",
        "bench_train_pass.py",
        "bench_vllm.py",
    ]


def test_agent_rollout_smoke(tmp_path):
    out = smoke("bench_agent_rollout.py", cwd=tmp_path)
    [row] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert row["episodes"] == 8 and row["batched"] > 0 and row["sequential"] > 0


def test_agent_turns_smoke(tmp_path):
    out = smoke("bench_agent_turns.py", cwd=tmp_path)
    rows = [line.split(" | ")[:3] for line in out.splitlines() if line.startswith("| t")]
    assert rows == [["| text", "2", "ardea"], ["| text", "4", "ardea"],
                    ["| tool", "2", "ardea"], ["| tool", "4", "ardea"]]  # fmt: skip


def test_agent_gae_smoke(tmp_path):
    out = smoke("bench_agent_gae.py", cwd=tmp_path)
    units = [line.split(" | ")[1] for line in out.splitlines() if line.startswith("| 0 |")]
    assert units == ["token", "turn"]
    assert not (tmp_path / "runs").exists()  # smoke runs leave nothing behind


def test_compile_smoke(tmp_path):
    out = smoke("bench_compile.py", cwd=tmp_path)
    [row] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert row["workload"] == "smoke" and row["backend"] == "eager"
    for part in ("decode", "train"):
        figures = row[part]
        assert f"| smoke | {part} |" in out
        assert figures["eager_s"] > 0 and figures["compiled_s"] > 0
        # the captured graphs run the same ops: the same samples and log-probs, bit for bit
        assert figures["max_abs_logprob_diff"] == 0.0
        assert figures["ratio"] == pytest.approx(
            figures["eager_s"] / figures["compiled_s"], rel=5e-2
        )


def test_compute_dtype_smoke(tmp_path):
    out = smoke("bench_compute_dtype.py", cwd=tmp_path)
    [row] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["case"] for r in row["rows"]] == ["matmul n=64", "tiny-model training pass 4x16"]
    assert all(r["fp32"] > 0 and r["bf16"] > 0 for r in row["rows"])
    assert row["auto"] == "torch." + row["probe"]["choice"]  # measured, not read from flags
    assert row["probe"]["decode_gflops"]["float32"] > 0
    assert len(row["probes"]) == 3  # the probe at three runs' shapes, each well under seconds
    assert all(p["choice"] in ("float32", "bfloat16") and p["seconds"] < 10 for p in row["probes"])


def test_gae_smoke(tmp_path):
    out = smoke("bench_gae.py", cwd=tmp_path)
    assert "bit-exact vs python loop f32 and seed column loop (rtol=0, atol=0): True" in out


def qwen2_params(vocab, hidden, intermediate, layers, heads, kv_heads):
    """Parameters of a tied-embedding Qwen2, by hand: q/k/v with biases, o, gate/up/down,
    two RMSNorms per layer, the final norm, the embedding (= LM head)."""
    kv = hidden // heads * kv_heads
    attention = hidden * hidden + hidden + 2 * (hidden * kv + kv) + hidden * hidden
    return vocab * hidden + layers * (attention + 3 * hidden * intermediate + 2 * hidden) + hidden


def test_rollout_smoke(tmp_path):
    out = smoke("bench_rollout.py", "--generic", cwd=tmp_path)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["mode"] for r in rows] == ["sample", "greedy", "sample+stop"]
    assert {r["params"] for r in rows} == {qwen2_params(110, 128, 384, 4, 4, 2)} == {802_688}
    sides = ("engine", "hf", "engine_generic")
    for r in rows:  # both precisions, every side, and the ratios of the pairs
        assert r["compute_dtype_auto"] in ("bfloat16", "float32")
        assert all(r[f"{side}_{p}_tps"] > 0 for side in sides for p in ("fp32", "auto"))
        assert r["ratio_fp32"] > 0 and r["ratio_auto"] > 0
        assert r["ratio_fast_over_generic_fp32"] > 0 and r["ratio_fast_over_generic_auto"] > 0
    cells = [line.split(" | ")[:6] for line in out.splitlines() if line.startswith("| 0.8M |")]
    assert [c[4] for c in cells] == ["sample", "greedy", "sample+stop"]
    assert all(c[1:4] == ["0.80M", "4", "8"] for c in cells)


def test_rollout_smoke_on_a_hybrid_family(tmp_path):
    """--arch takes docs/reference/models.md's families: Qwen3-Next (gated delta nets, MoE)
    is built at the smoke's size and greedy-decodes the same tokens on both sides (the
    script asserts it in fp32)."""
    out = smoke("bench_rollout.py", "--arch", "qwen3_next", cwd=tmp_path)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["mode"] for r in rows] == ["sample", "greedy", "sample+stop"]
    assert all(r["engine_fp32_tps"] > 0 and r["hf_fp32_tps"] > 0 for r in rows)
    assert "# qwen3_next models" in out


def test_distillation_smoke(tmp_path):
    out = smoke("bench_distillation.py", cwd=tmp_path)
    arms = [line.split(" | ")[1] for line in out.splitlines() if line.startswith("| 0 |")]
    assert arms == ["grpo", "distill", "both"]
    assert not (tmp_path / "runs").exists()  # smoke runs leave nothing behind


def test_reward_model_smoke(tmp_path):
    out = smoke("bench_reward_model.py", cwd=tmp_path)
    arms = [line.split(" | ")[2] for line in out.splitlines() if line.startswith("| 0 |")]
    assert arms == ["reward model", "verifier"]
    assert not (tmp_path / "runs").exists()


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
    m = 2 * (2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64)  # 18,432 per token in the layers

    def forward(s, heads):  # layers, causal attention over 2 × 32 query dims, the head
        return 2 * m * s + 2 * 2 * 32 * s * (s + 1) + 2 * 262 * 32 * heads

    assert row["decode_flops"] == 4 * forward(13, 8) == 2_546_688
    assert row["train_flops"] == 16 * forward(14, 14) == 12_443_648
    assert row["flops_per_step"] == row["decode_flops"] + row["train_flops"]
    assert row["ardea_gflops"] == pytest.approx(
        row["flops_per_step"] / row["ardea_s_per_step"] / 1e9
    )
    # the floor: each part's FLOPs at the rate measured at its shape, in ardea's precision
    rates = row["floor_rates"]["fp32"]
    floor = row["decode_flops"] / rates["decode"] / 1e9 + row["train_flops"] / rates["train"] / 1e9
    assert row["ardea_floor_s"] == pytest.approx(floor)
    assert row["ardea_percent_of_floor"] == pytest.approx(100 * floor / row["ardea_s_per_step"])
    assert row["workload"] == "smoke" and "| smoke | fp32+ref | fp32 |" in out


def test_train_pass_smoke(tmp_path):
    out = smoke("bench_train_pass.py", cwd=tmp_path)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    passes = {r["case"]: r for r in rows if r["table"] == "train_pass"}
    assert set(passes) == {"fp32", "bf16", "bf16+sdpa"}
    assert passes["bf16+sdpa"]["attn_implementation"] == "sdpa"
    fp32 = passes["fp32"]  # same initial weights, same tokens: the same loss
    assert fp32["losses_agree"] is True and fp32["loss_diff"] <= 1e-5
    assert fp32["compute_dtype"] == "float32"
    assert passes["bf16"]["loss_diff"] < 1e-2
    # smoke shape by hand: vocab 262 (ardea's character tokenizer), H 32, I 64, 2 layers,
    # 2 heads, 1 KV head; the untied tiny model adds an LM head of 262 × 32
    assert fp32["params"] == qwen2_params(262, 32, 64, 2, 2, 1) + 262 * 32
    for r in passes.values():
        assert r["overhead_pct"] == pytest.approx(100 * (r["ardea_s"] / r["hand_s"] - 1))
    kernels = [r for r in rows if r["table"] == "attention"]
    assert [(r["seq"], r["batch"]) for r in kernels] == [(16, 4), (32, 2)]  # equal tokens
    assert all(r["faster"] == ("eager" if r["eager_s"] < r["sdpa_s"] else "sdpa") for r in kernels)


def test_logprob_memory_smoke(tmp_path):
    out = smoke("bench_logprob_memory.py", cwd=tmp_path)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    check, ardea, naive, summary = rows
    assert check["logprobs_agree"] is True and check["logprob_max_diff"] <= 1e-5
    assert check["grad_max_diff"] <= 1e-5 and check["check_shape"] == [2, 128]
    assert (ardea["method"], naive["method"]) == ("ardea", "naive")
    for r in (ardea, naive):  # each in its own process, the peak since its own baseline
        assert (r["vocab"], r["batch"], r["seq"]) == (1000, 2, 128)
        assert r["added_mib"] == pytest.approx(r["peak_rss_mib"] - r["baseline_rss_mib"])
    assert ardea["loss"] == pytest.approx(naive["loss"], abs=1e-5)
    assert summary["ratio"] == pytest.approx(ardea["added_mib"] / naive["added_mib"])


def test_vllm_smoke(tmp_path):
    """Starts a real vLLM server (.venv-vllm) for the smallest model and compares."""
    out = smoke("bench_vllm.py", cwd=tmp_path)
    [row] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert row["rows"] == 8 and row["vllm_tok_s"] > 0 and row["in_process_tok_s"] > 0
    assert all(row[f"sync_{t}_s"] > 0 for t in ("state_dict", "file", "http"))


def test_lora_sync_smoke(tmp_path):
    out = smoke("bench_lora_sync.py", cwd=tmp_path)
    [row] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    # rank 8 on q, k, v, o of 2 layers (hidden 64, kv 32): 2 x (4 x 8 x 64 + 8 x (64 + 32 x 2
    # + 64)) floats of 4 bytes
    assert row["adapter_bytes"] == 2 * (4 * 8 * 64 + 8 * (64 + 32 + 32 + 64)) * 4
    assert row["merged_bytes"] > 10 * row["adapter_bytes"] and row["adapter_s"] > 0


def test_routing_replay_smoke(tmp_path):
    out = smoke("bench_routing_replay.py", cwd=tmp_path)
    rows = {r["replay"]: r for r in map(json.loads, filter(lambda x: x.startswith("{"), out.splitlines()))}  # fmt: skip
    assert set(rows) == {"false", "true"}
    assert "moe/routing_replay_changed" in rows["true"]
    assert "moe/routing_replay_changed" not in rows["false"]
    assert "| true |" in out


def test_mismatch_smoke(tmp_path):
    out = smoke("bench_mismatch.py", cwd=tmp_path)
    [row] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert row["noise"] == 1.0 and row["mismatch/abs_diff_mean"] > 0.01
    assert all(-1.0 <= row[f"{m}_cos"] <= 1.0 for m in ("on-policy", "uncorrected", "token_tis"))


def test_torchrun_smoke(tmp_path):
    # one workload (a torchrun launch costs ~20 s here): the one with the most phases
    out = smoke("bench_torchrun.py", "--workloads", "online_grpo_kl", cwd=tmp_path)
    [row] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert row["workload"] == "online_grpo_kl"
    assert row["two_over_one"] == row["two"]["seconds_per_step"] / row["one"]["seconds_per_step"]
    assert row["two"]["phases"]["generate"] > 0 and row["two"]["phases"]["advantages"] > 0


def test_partial_smoke(tmp_path):
    out = smoke("bench_partial.py", cwd=tmp_path)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    engine, off, on = rows
    assert engine["engine"] == "in_process"
    assert engine["speedup"] == engine["batch"]["seconds"] / engine["continuous"]["seconds"]
    assert engine["continuous"]["tail_s"] == 0.0 < engine["batch"]["tail_s"]
    assert (off["partial"], on["partial"]) == (False, True) and off["resumed_fraction"] == 0.0
    assert [s for s, _ in off["accuracy"]] == [s for s, _ in on["accuracy"]] != []

"""A shortened SFT run (configs/sft_arithmetic.yaml) through the real ``ardea`` CLI, then
eval/generate/report on it."""

import json
import re
from pathlib import Path

import pytest
import torch
from cli_testing import ardea
from transformers import AutoModelForCausalLM, AutoTokenizer

from ardea.model.dtype_probe import FORCE_ENV

pytestmark = pytest.mark.slow
SFT_CONFIG = Path(__file__).parents[2] / "configs" / "sft_arithmetic.yaml"

SHORT_RUN = [
    "trainer.max_steps=600",
    "trainer.warmup_steps=30",
    "trainer.batch_size=32",
    "trainer.eval_every=200",
    "trainer.save_every=300",
    "trainer.num_threads=1",
    # the precision is named, not measured: `ardea eval` below must decode as the run did,
    # and compute_dtype=auto measured again on a busier moment may choose the other one
    "model.compute_dtype=float32",
    "data.task_args.digits=2",
    "data.train_size=5000",
    "data.eval_size=200",
    "trainer.eval_samples=4",  # and the sampled metrics at each evaluation
    "trainer.eval_k=2",
    "logging.log_every=25",
    "logging.progress=false",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    ardea("train", str(SFT_CONFIG), *SHORT_RUN, f"trainer.output_dir={root / 'run'}", cwd=root)
    return root / "run"


def test_run_directory_holds_everything(run_dir):
    for name in ("config.yaml", "metrics.jsonl", "results.json", "report.png"):
        assert (run_dir / name).is_file(), name
    assert any((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    assert [c.name for c in checkpoints] == ["step_0000300", "step_0000600"]
    policy = checkpoints[-1] / "policy"
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (policy / name).is_file(), name
    assert "max_steps: 600" in (run_dir / "config.yaml").read_text()


def test_accuracy_rose_and_metrics_were_logged(run_dir):
    results = json.loads((run_dir / "results.json").read_text())
    # from scratch the model answers nothing; 600 steps of 2-digit sums reach several percent
    assert results["accuracy_initial"] == 0.0
    assert results["best_accuracy"] >= 0.03, results
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in records if "train/loss" in r]
    assert len(losses) == 24 and losses[-1] < 0.5 * losses[0]
    assert [r["step"] for r in records if "eval/accuracy" in r] == [0, 200, 400, 600]
    for name in ("eval/avg@4", "eval/pass@2", "eval/maj@2", "eval/maj@2_se"):
        assert [r["step"] for r in records if name in r] == [0, 200, 400, 600], name
    last = next(r for r in reversed(records) if "eval/avg@4" in r)
    assert 0 <= last["eval/avg@4"] <= last["eval/pass@2"] <= 1  # pass@2 >= pass@1 always
    assert results["avg@4"] == last["eval/avg@4"] and results["maj@2"] == last["eval/maj@2"]
    assert results["eval_sampling"] == {"n": 4, "k": 2, "temperature": 1.0, "top_p": 1.0,
                                        "top_k": 0, "max_new_tokens": 16, "seed": 0}  # fmt: skip
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {0, 200, 400, 600}


def test_checkpoint_loads_with_plain_transformers_and_matches_ardea(run_dir):
    """``ardea generate`` on the checkpoint decodes greedily what plain transformers'
    ``generate`` decodes, both in float32. Pinned: on a model directory ``ardea generate``
    computes in what ``compute_dtype=auto`` picks, bf16 where it measures faster (an AMX
    Xeon), and a greedy argmax over bf16 logits can take another token ("57+8=" decoded
    "61" against "64" there): equal text holds only for the same arithmetic."""
    policy = sorted((run_dir / "checkpoints").glob("step_*"))[-1] / "policy"
    model = AutoModelForCausalLM.from_pretrained(policy)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    prompts = ["12+34=", "57+8=", "99+99="]
    expected = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=8, do_sample=False)
        expected.append(prompt + tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    args = [a for p in prompts for a in ("--prompt", p)]
    float32 = {FORCE_ENV: "float32"}
    shown = ardea("generate", str(policy), *args, "--max-new-tokens", "8", cwd=run_dir, env=float32)
    assert shown.stdout.splitlines() == expected


def test_eval_and_report_commands(run_dir):
    results = json.loads((run_dir / "results.json").read_text())
    out = ardea("eval", str(run_dir), "--k", "2", "--num-samples", "4", cwd=run_dir).stdout
    shown = re.search(r"accuracy\s*│\s*([\d.]+)%", out)  # the table's greedy accuracy row
    assert shown is not None, out
    # the same greedy accuracy as at the end of training
    assert float(shown.group(1)) == pytest.approx(100 * results["accuracy"], abs=0.05)
    assert re.search(r"pass@2\s*│\s*[\d.]+% ± [\d.]+%", out), out  # with its standard error
    assert re.search(r"avg@4\s*│\s*[\d.]+% ± [\d.]+%", out), out
    assert re.search(r"maj@2\s*│\s*[\d.]+% ± [\d.]+%", out), out
    assert "sampled: n=4, k=2, temperature=1.0" in out
    data = Path(__file__).parents[2] / "examples" / "data" / "prompts.jsonl"  # 200 2-digit sums
    out = ardea("eval", str(run_dir), "--data", str(data), cwd=run_dir).stdout
    assert "prompts.jsonl: 200 prompts, the arithmetic verifier" in out
    assert re.search(r"accuracy\s*│\s*[\d.]+%", out), out
    (run_dir / "report.png").unlink()
    ardea("report", str(run_dir), cwd=run_dir)
    assert (run_dir / "report.png").stat().st_size > 10_000

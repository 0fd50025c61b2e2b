"""The guard against a silent collapse, through the real CLI: a stage that learns 1-digit
addition, then a stage at a learning rate far too high for it. The second stage says in one
line that its accuracy fell far below its best, and ``trainer.keep_best`` keeps the
checkpoint of that best evaluation beside the last one, both named in results.json."""

import json

import pytest
import torch
from cli_testing import ardea
from safetensors.torch import load_file

from ardea.trainer.checkpoint import checkpoint_problem, load_trainer_state

pytestmark = pytest.mark.slow

TINY = [
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.num_heads=4",
    "model.num_kv_heads=4",
    "model.intermediate_size=128",
    "trainer.num_threads=1",
    "logging.progress=false",
    "logging.tensorboard=false",
]
STAGES = (
    "stages={learn: {trainer: {max_steps: 150, lr: 1.0e-2, eval_every: 50}}, "
    "collapse: {trainer: {max_steps: 20, lr: 3.0, warmup_steps: 0, eval_every: 10, "
    "keep_best: true}}}"
)


def test_a_collapsing_run_warns_and_keeps_its_best_checkpoint(tmp_path):
    run = tmp_path / "run"
    done = ardea(
        "train",
        "--recipe",
        "none",
        *TINY,
        "algo.name=sft",
        "data.task=arithmetic",
        "data.task_args={digits: 1}",
        "data.eval_size=8",
        "data.train_size=256",
        "trainer.batch_size=64",
        "trainer.warmup_steps=10",
        STAGES,
        f"trainer.output_dir={run}",
        cwd=tmp_path,
    )
    out = done.stdout + done.stderr  # messages go to stderr, beside the progress bar
    learned = json.loads((run / "learn" / "results.json").read_text())
    assert learned["accuracy"] >= 0.5, learned  # the first stage learned
    assert "best_checkpoint" not in learned  # keep_best is off there
    results = json.loads((run / "collapse" / "results.json").read_text())
    assert results["accuracy"] <= learned["accuracy"] - 0.4, results  # the lr destroyed it
    warnings = [line for line in out.splitlines() if "far below its best" in line]
    assert warnings and all(line.startswith("warning: eval/accuracy fell to") for line in warnings)
    assert f"its best {learned['accuracy']:.4g} at step 0" in warnings[0], warnings
    # the best evaluation is the stage's start (the first stage's final policy), kept
    assert results["best_step"] == 0 and results["best_metric"] == "eval/accuracy"
    assert results["best_value"] == learned["accuracy"]
    best = run / "collapse" / "checkpoints" / "best"
    assert results["best_checkpoint"] == str(best / "policy")
    assert checkpoint_problem(best) is None and load_trainer_state(best)["step"] == 0
    assert results["checkpoint"].endswith("step_0000020/policy")  # the last, as ever
    start = load_file(f"{learned['checkpoint']}/model.safetensors")
    kept = load_file(f"{best}/policy/model.safetensors")
    assert start.keys() == kept.keys() and all(torch.equal(start[k], kept[k]) for k in start)

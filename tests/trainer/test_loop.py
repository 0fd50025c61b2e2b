"""The training loop in-process: non-finite steps, LoRA checkpoints and resume, W&B offline."""

import json
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import SMALLEST_OVERRIDES
from transformers import AutoModelForCausalLM

from ardea.config import load_config
from ardea.errors import ArdeaError
from ardea.model.dtype_probe import FORCE_ENV
from ardea.trainer import Trainer

SMALL = [
    *SMALLEST_OVERRIDES,
    "data.task_args.digits=2",
    "data.train_size=64",
    "data.eval_size=8",
    "trainer.batch_size=8",
    "trainer.warmup_steps=1",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.report=false",  # no report.png: half a second a run
]


def make(tmp_path, *extra):
    return Trainer(load_config(None, [*SMALL, f"trainer.output_dir={tmp_path}", *extra]))


def poison_steps(trainer, bad_steps):
    """Make the strategy's loss NaN on the given (1-based) optimizer steps."""
    original = trainer.strategy.loss

    def loss(batch, counts):
        value, metrics = original(batch, counts)
        if trainer.step + 1 in bad_steps:
            value = value * float("nan")
            metrics = {**metrics, "train/loss": float("nan")}
        return value, metrics

    trainer.strategy.loss = loss


def test_nonfinite_steps_are_skipped_and_counted(tmp_path):
    trainer = make(tmp_path, "trainer.max_steps=6", "logging.log_every=1")
    poison_steps(trainer, {3, 4})
    snapshots = {}
    original_step = trainer.train_step

    def recording_step():
        metrics = original_step()
        snapshots[trainer.step + 1] = [
            p.detach().clone() for p in trainer.updater.components[0].parameters
        ]
        return metrics

    trainer.train_step = recording_step
    results = trainer.train()
    assert results["nonfinite_steps"] == 2
    for before, after in zip(snapshots[2], snapshots[4]):  # steps 3 and 4 changed nothing
        assert torch.equal(before, after)
    assert not all(torch.equal(a, b) for a, b in zip(snapshots[4], snapshots[5]))
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    counts = [r["train/nonfinite_steps"] for r in records if "train/nonfinite_steps" in r]
    assert counts == [0, 0, 1, 2, 2, 2]


def test_too_many_nonfinite_steps_stop_with_the_last_good_state_saved(tmp_path):
    trainer = make(tmp_path, "trainer.max_steps=20", "trainer.max_nonfinite_steps=3")
    poison_steps(trainer, {3, 4, 5, 6, 7})
    with pytest.raises(ArdeaError, match=r"stopped at step 5: 3 consecutive steps .* saved in"):
        trainer.train()
    saved = tmp_path / "checkpoints" / "step_0000005" / "policy" / "model.safetensors"
    weights = load_file(saved)
    live = {k: v for k, v in trainer.policy.state_dict().items()}
    assert all(torch.equal(weights[k], live[k]) for k in weights)


def test_lora_checkpoint_exports_adapter_and_merged_model_and_resumes(tmp_path):
    config = ["model.lora_r=4", "model.lora_alpha=8", "trainer.lr=0.05", "trainer.save_every=3"]
    trainer = make(tmp_path / "a", "trainer.max_steps=6", *config)
    trainer.train()
    checkpoint = tmp_path / "a" / "checkpoints" / "step_0000006"
    assert (checkpoint / "adapter" / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(checkpoint / "policy")
    ids = torch.randint(6, 100, (2, 7))
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, trainer.policy(input_ids=ids).logits, atol=1e-5)

    # continue a copy of the run from its step-3 checkpoint: same adapter weights at the end
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step_0000006")
    resumed = make(tmp_path / "b", "trainer.max_steps=6", "trainer.resume=auto", *config)
    assert resumed.step == 3
    resumed.train()
    final_a = load_file(checkpoint / "adapter" / "adapter_model.safetensors")
    final_b = load_file(
        tmp_path / "b" / "checkpoints" / "step_0000006" / "adapter" / "adapter_model.safetensors"
    )
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)


def test_wandb_offline_logs_without_network(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    trainer = make(tmp_path, "trainer.max_steps=2", "logging.wandb=true", "logging.log_every=1")
    trainer.train()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs and any(runs[0].glob("*.wandb"))


def test_time_budget_ends_the_run_like_max_steps(tmp_path):
    trainer = make(tmp_path, "trainer.max_steps=100000", "trainer.max_train_seconds=1.5")
    durations = []
    train_step = trainer.train_step

    def timed():
        start = time.perf_counter()
        metrics = train_step()
        durations.append(time.perf_counter() - start)
        return metrics

    trainer.train_step = timed
    results = trainer.train()
    assert 1 <= results["steps"] == len(durations) < 100000
    # the step that crossed the budget ends the run: the budget was not spent before it
    assert trainer.train_seconds >= 1.5 > trainer.train_seconds - durations[-1]
    final = tmp_path / "checkpoints" / f"step_{results['steps']:07d}"
    assert (final / "policy" / "model.safetensors").is_file()
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r["step"] for r in records if "eval/accuracy" in r]
    assert evaluated == [0, results["steps"]]  # once at the start, once at the end


def test_evaluation_sees_the_trained_weights(tmp_path, auto_compute_dtype):
    """An offline run's evaluations generate with the weights trained so far (handed to the
    engine with update_weights), the same greedy answers as a fresh engine on the policy in
    the run's precision. Under both answers of ``compute_dtype=auto``: a fresh engine in
    float32 against the run's bf16 evaluation can answer differently (a greedy argmax over
    other logits), which a machine whose auto picks float32 never shows."""
    from ardea.rollout import EngineSpec, make_engine, own_copy
    from ardea.trainer.evaluate import evaluate_task

    trainer = make(tmp_path, "trainer.max_steps=40", "trainer.eval_every=20", "trainer.lr=1e-2")
    assert trainer.precision.compute == getattr(torch, auto_compute_dtype)
    results = trainer.train()
    spec = EngineSpec.of(trainer.policy, trainer.tokenizer, precision=trainer.precision)
    fresh = make_engine("in_process", spec, module=own_copy(trainer.policy))
    again = evaluate_task(
        fresh,
        trainer.tokenizer,
        trainer.task,
        trainer.evaluator.examples,
        max_new_tokens=trainer.config.rollout.max_new_tokens,
    )
    assert trainer.service.engine.version == 2  # the evaluations of steps 20 and 40
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    shown = [json.loads(x)["completion"] for x in lines if json.loads(x)["step"] == 40]
    first = [json.loads(x)["completion"] for x in lines if json.loads(x)["step"] == 0]
    assert shown == [completion for _, completion, _ in again.samples[: len(shown)]]
    assert shown != first  # training changed the answers, and the evaluation saw it
    assert results["accuracy"] == again.metrics["accuracy"]


def test_auto_compute_dtype_is_measured_printed_and_stored(tmp_path, capsys, monkeypatch):
    """compute_dtype=auto: the probe ran at this run's shapes (the tiny model's hidden and
    intermediate sizes), its line is printed at start, and results.json keeps the choice
    and the rates; an explicit dtype is stored without a probe."""
    monkeypatch.delenv(FORCE_ENV, raising=False)  # measured, whatever the suite forces
    trainer = make(tmp_path / "auto", "trainer.max_steps=1")
    assert "compute_dtype=auto: " in capsys.readouterr().out
    results = trainer.train()
    probe = results["compute_dtype_probe"]
    assert results["compute_dtype"] == probe["choice"] in ("float32", "bfloat16")
    assert set(probe["decode_gflops"]) == {"float32", "bfloat16"} and probe["train_gflops"]
    stored = json.loads((trainer.run_dir / "results.json").read_text())
    assert stored["compute_dtype_probe"] == probe
    fixed = make(tmp_path / "fp32", "trainer.max_steps=1", "model.compute_dtype=float32")
    results = fixed.train()
    assert results["compute_dtype"] == "float32" and "compute_dtype_probe" not in results


def test_the_report_is_drawn_at_the_end_unless_logging_report_is_false(tmp_path):
    """The default draws report.png when the run ends; logging.report=false leaves it out,
    and ``draw_report`` (what ``ardea report`` runs) draws it from the run's files later."""
    from ardea.trainer import draw_report

    drawn = make(tmp_path / "on", "trainer.max_steps=1", "logging.report=true")
    drawn.train()
    assert (drawn.run_dir / "report.png").stat().st_size > 10_000
    skipped = make(tmp_path / "off", "trainer.max_steps=1")  # SMALL: logging.report=false
    skipped.train()
    assert (skipped.run_dir / "metrics.jsonl").is_file()
    assert not (skipped.run_dir / "report.png").exists()
    assert draw_report(skipped.run_dir).stat().st_size > 10_000


def test_a_checkpoint_before_the_first_update_leaves_the_optimizer_unstepped(tmp_path):
    """keep_best saves the best checkpoint after the evaluation at step 0, before any
    update. Its optimizer state is empty, and the run trains as one that saved nothing:
    the same weights after two steps, bit for bit. (Asking torch's state-dict helper for an
    optimizer that has not stepped initialises it with a step at learning rate 0: Adam's step
    count would become 1 and the first real update would be bias-corrected as a second.)"""
    from ardea.trainer.checkpoint import load_trainer_state

    runs = {}
    for name, best in (("saved", "true"), ("not_saved", "false")):
        trainer = make(tmp_path / name, "trainer.max_steps=2", "trainer.eval_every=1",
                       f"trainer.keep_best={best}")  # fmt: skip
        trainer.train()
        runs[name] = trainer
    best = tmp_path / "saved" / "checkpoints" / "best"
    state = load_trainer_state(best)
    assert (
        state["step"] == 0 and state["updater"]["components"]["train"]["optimizer"]["state"] == {}
    )
    saved, plain = (dict(runs[n].policy.named_parameters()) for n in ("saved", "not_saved"))
    assert all(torch.equal(saved[k], plain[k]) for k in plain)
    fresh = make(tmp_path / "fresh", "trainer.max_steps=1")
    fresh.updater.load_state_dict(state["updater"])  # an empty state loads as empty
    assert not fresh.updater.optimizer.state

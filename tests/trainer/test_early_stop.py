"""The early stop: its verdict on hand-written histories, and runs that stop where a run
without it shows they should (the held-out loss curve of an unstopped run, same seed)."""

import json

import pytest
from tiny_models import SMALLEST_OVERRIDES

from ardea.config import load_config
from ardea.errors import ConfigError
from ardea.trainer import Trainer
from ardea.trainer.early_stop import EarlyStop


def rule(target=None, patience=0, metric="auto", mode="max", min_delta=0.0):
    return EarlyStop(
        metric=metric, mode=mode, target=target, patience=patience, min_delta=min_delta
    )


def test_a_target_stops_at_the_first_evaluation_that_reaches_it():
    history = {"eval/accuracy": [[0, 0.48], [50, 0.97]]}
    assert rule(target=0.99).verdict(history) is None
    history["eval/accuracy"].append([100, 0.992])
    assert rule(target=0.99).verdict(history).startswith("eval/accuracy 0.992 >= ")
    low = {"eval/loss": [[0, 2.5], [10, 0.7]]}
    assert rule(target=0.7, metric="eval/loss", mode="min").verdict(low) is not None  # 0.7 <= 0.7
    assert rule(target=0.69, metric="eval/loss", mode="min").verdict(low) is None


def test_patience_counts_evaluations_without_a_gain_beyond_min_delta():
    # best 0.50 at step 10; 0.52 is not a gain of more than 0.05; 0.51 neither: two in a row
    values = [[0, 0.30], [10, 0.50], [20, 0.52], [30, 0.51]]
    assert rule(patience=2, min_delta=0.05).verdict({"eval/accuracy": values[:3]}) is None
    reason = rule(patience=2, min_delta=0.05).verdict({"eval/accuracy": values})
    assert "not improved on 0.5 for 2 evaluations" in reason
    # without min_delta 0.52 is a gain: one evaluation without one since, not two
    assert rule(patience=2).verdict({"eval/accuracy": values}) is None
    # in mode min a falling loss is the gain
    losses = [[0, 3.0], [5, 2.0], [10, 2.1], [15, 2.05]]
    assert rule(patience=2, metric="eval/loss", mode="min").verdict({"eval/loss": losses})


def test_auto_watches_what_keep_best_watches_and_a_missing_metric_is_named():
    history = {"eval/loss": [[0, 1.0]], "eval/reward_mean": [[0, 0.9]]}
    assert rule(target=0.5).verdict(history).startswith("eval/reward_mean 0.9")
    with pytest.raises(ConfigError, match="auto watches eval/accuracy.*eval/loss"):
        rule(target=0.5).verdict({"eval/loss": [[0, 1.0]]})
    with pytest.raises(ConfigError, match="'eval/acc' is not among .*eval/loss"):
        rule(target=0.5, metric="eval/acc").verdict({"eval/loss": [[0, 1.0]]})


def test_an_early_stop_needs_evaluations_during_the_run():
    with pytest.raises(ConfigError, match="trainer.eval_every=0 evaluates only at the end"):
        load_config(None, ["trainer.eval_every=0", "trainer.early_stop_target=0.9"])
    with pytest.raises(ConfigError, match="early_stop_mode='best'"):
        load_config(None, ["trainer.early_stop_mode=best"])


#: DPO on the task's preference pairs: a held-out eval/loss that moves from the first step
RUN = [
    "algo.name=dpo",
    *SMALLEST_OVERRIDES,
    "data.task_args.digits=2",
    "data.train_size=64",
    "data.eval_size=8",
    "trainer.batch_size=8",
    "trainer.warmup_steps=1",
    "trainer.lr_schedule=constant",
    "trainer.eval_every=1",
    "trainer.save_every=0",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.report=false",
]


def train(run_dir, *extra):
    Trainer(load_config(None, [*RUN, f"trainer.output_dir={run_dir}", *extra])).train()
    results = json.loads((run_dir / "results.json").read_text())
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [(r["step"], r["eval/loss"]) for r in records if "eval/loss" in r]
    return results, losses


def test_a_run_stops_where_the_unstopped_run_first_reaches_the_target(tmp_path):
    _, curve = train(tmp_path / "full", "trainer.max_steps=6")
    assert [step for step, _ in curve] == list(range(7))  # evaluated before and after each step
    target = sorted(loss for _, loss in curve)[3]  # reached somewhere inside the run
    expected = next(step for step, loss in curve if loss <= target)
    assert 0 < expected < 6

    stop = ["trainer.max_steps=6", "trainer.early_stop_metric=eval/loss"]
    stop += ["trainer.early_stop_mode=min", f"trainer.early_stop_target={target!r}"]
    results, losses = train(tmp_path / "stopped", *stop)
    assert results["steps"] == expected
    assert results["stopped_early"]["step"] == expected
    assert losses == curve[: expected + 1]  # the same run, cut at the stop, evaluated once there
    saved = sorted(p.name for p in (tmp_path / "stopped" / "checkpoints").iterdir())
    assert saved == [f"step_{expected:07d}"]

    # resumed, it stays stopped: nothing trained, nothing saved
    results, again = train(tmp_path / "stopped", *stop, "trainer.resume=auto")
    assert results["steps"] == expected and again == losses
    assert sorted(p.name for p in (tmp_path / "stopped" / "checkpoints").iterdir()) == saved


def test_patience_and_a_target_met_before_training(tmp_path):
    # min_delta 100: no evaluation is a gain, so the second after the first one stops
    results, losses = train(
        tmp_path / "patience",
        "trainer.max_steps=20",
        "trainer.early_stop_patience=2",
        "trainer.early_stop_metric=eval/loss",
        "trainer.early_stop_mode=min",
        "trainer.early_stop_min_delta=100",
    )
    assert results["steps"] == 2 and [s for s, _ in losses] == [0, 1, 2]
    # a model that already meets the target: stopped at step 0, its checkpoint saved
    results, losses = train(
        tmp_path / "met", "trainer.max_steps=20", "trainer.early_stop_target=0.0"
    )  # auto: eval/accuracy, 0 or more
    assert results["steps"] == 0 and len(losses) == 1
    assert (tmp_path / "met" / "checkpoints" / "step_0000000" / "policy").is_dir()

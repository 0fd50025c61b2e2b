"""The end of a run: ``results.json`` and the printed table of results."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ardea.trainer.checkpoint import BEST_DIR, checkpoint_dir
from ardea.trainer.profile import print_profile


def write_results(run_dir: Path, results: dict[str, Any]) -> Path:
    path = Path(run_dir) / "results.json"
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return path


def print_results(results: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title="ardea results", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in results.items():
        if isinstance(value, float) and "accuracy" in name:
            shown = f"{value:.1%}"
        elif isinstance(value, float):
            shown = f"{value:,.2f}"
        else:
            shown = str(value)
        table.add_row(name, shown)
    console.print(table)


def finish_run(trainer: Any, *, checkpoint: Path | None, wall_seconds: float) -> dict[str, Any]:
    """Collect the run's figures, write ``results.json``, print the table, return the dict."""
    results: dict[str, Any] = {
        "strategy": trainer.config.algo.name,
        "task": trainer.config.data.task,
        "data": trainer.config.data.path,
        "steps": trainer.step,
        "parameters": sum(p.numel() for p in trainer.policy.parameters()),
        "trainable_parameters": sum(
            p.numel() for p in trainer.policy.parameters() if p.requires_grad
        ),
    }
    accuracies = trainer.history.get("eval/accuracy", [])
    if accuracies:
        results["accuracy_initial"] = accuracies[0][1]
        results["accuracy"] = accuracies[-1][1]
        results["best_accuracy"] = max(a for _, a in accuracies)
        results["eval_examples"] = len(trainer.evaluator.examples)
    sampled = trainer.evaluator.sampled
    if sampled is not None and accuracies:  # the sampled metrics, and how they were sampled
        results["eval_sampling"] = dataclasses.asdict(sampled)
        for name in (f"avg@{sampled.n}", f"pass@{sampled.k}", f"maj@{sampled.k}"):
            if values := trainer.history.get(f"eval/{name}", []):
                results[f"{name}_initial"], results[name] = values[0][1], values[-1][1]
    metrics = (
        ("eval/reward_mean", "eval_reward"),
        ("eval/loss", "eval_loss"),
        ("eval/rm_accuracy", "rm_accuracy"),
        ("eval/success_rate", "success"),
    )
    for metric, key in metrics:
        values = trainer.history.get(metric, [])
        if values:
            results[f"{key}_initial"] = values[0][1]
            results[key] = values[-1][1]
    results["distributed"] = {"mode": trainer.dist.mode, "world_size": trainer.dist.world_size}
    precision = trainer.precision
    results["compute_dtype"] = str(precision.compute).removeprefix("torch.")
    if precision.probe is not None:  # compute_dtype=auto: what the choice was measured on
        results["compute_dtype_probe"] = dataclasses.asdict(precision.probe)
    results["nonfinite_steps"] = trainer.nonfinite["total"]
    results["train_seconds"] = round(trainer.train_seconds, 1)
    results["wall_seconds"] = round(wall_seconds, 1)
    results["checkpoint"] = str(Path(checkpoint) / "policy") if checkpoint else None
    if trainer.best is not None:  # trainer.keep_best
        name, step = trainer.best["metric"], trainer.best["step"]
        results["best_checkpoint"] = str(checkpoint_dir(trainer.run_dir, BEST_DIR) / "policy")
        results["best_step"] = step
        results["best_metric"] = name
        results["best_value"] = next(v for s, v in trainer.history[name] if s == step)
    if trainer.stopped is not None:  # trainer.early_stop_*
        results["stopped_early"] = {"step": trainer.step, "reason": trainer.stopped}
    results["run_dir"] = str(trainer.run_dir)
    results["profile"] = trainer.profile.summary(trainer.profile.rates(precision))
    write_results(trainer.run_dir, results)
    print_results({k: v for k, v in results.items() if k not in ("profile", "compute_dtype_probe")})
    print_profile(results["profile"])
    return results

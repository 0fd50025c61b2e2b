"""Runs of several stages, one after the other: e.g. the default recipe, SFT then online RL.

``config.stages`` maps stage names, in order, to overrides of the config's sections. Every
stage config is built and validated before the first stage starts (a typo in the last
stage fails in seconds, not after the first stage's minutes). Stage ``k`` then runs as an
ordinary run in ``<run dir>/<name>/`` (its own ``config.yaml``, metrics, checkpoints,
report) and starts from the final policy of stage ``k − 1`` unless it sets ``model.path``.

The run directory itself gets the full ``config.yaml`` and a ``results.json`` with each
stage's results under its name, ``wall_seconds`` for the whole run and, when the run has
online RL stages, ``accuracy_before_rl`` (held-out accuracy when the first online stage
started) and ``accuracy_after_rl`` (when the last one ended).

``trainer.resume=auto`` continues where the run stopped: finished stages are not trained
again (their final checkpoint is reloaded and their results are read back), the stage
that was interrupted resumes from its last checkpoint, later stages start fresh. Wall
times (``wall_seconds``, the whole run's and each stage's) count this invocation only, as
for a resumed single run; ``train_seconds`` carries on across resumes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ardea.config import ArdeaConfig, stage_configs
from ardea.errors import ConfigError
from ardea.trainer.loop import Trainer
from ardea.trainer.report import draw_stages_report
from ardea.trainer.results import print_results, write_results
from ardea.trainer.setup import prepare_run_directory, run_directory
from ardea.trainer.strategies import strategy_class


def run(config: ArdeaConfig) -> dict[str, Any]:
    """Train ``config``: one run, or its stages in order; returns the results."""
    if not config.stages:
        return Trainer(config).train()
    return run_stages(config)


def plan_stages(config: ArdeaConfig) -> list[tuple[str, ArdeaConfig]]:
    """Every stage's config, validated, with its output directory set."""
    top = run_directory(config)
    stages = stage_configs(config)
    for index, (name, stage) in enumerate(stages):
        strategy_class(stage.algo.name)  # an unknown strategy fails before any work
        stage.trainer.output_dir = str(top / name)
        stage.trainer.resume = config.trainer.resume
        if index and _sets_model_path(config, name) and not Path(stage.model.path).is_dir():
            raise ConfigError(f"stages.{name}.model.path={stage.model.path!r} is not a directory")
    return stages


def _sets_model_path(config: ArdeaConfig, name: str) -> bool:
    model = config.stages[name].get("model") or {}
    return "path" in model


def run_stages(config: ArdeaConfig) -> dict[str, Any]:
    start = time.time()
    stages = plan_stages(config)
    top = run_directory(config)
    results: dict[str, Any] = {"stages": [name for name, _ in stages]}
    previous: str | None = None
    online: list[str] = []
    for index, (name, stage) in enumerate(stages):
        if previous is not None and not _sets_model_path(config, name):
            stage.model.path = previous
        print(f"[ardea] stage {name!r}: {stage.algo.name}, {stage.trainer.max_steps} steps")
        trainer = Trainer(stage)  # checks the stage's model and data before anything is written
        if index == 0:
            prepare_run_directory(config)
        outcome = trainer.train()
        results[name] = outcome
        previous = outcome["checkpoint"]
        if strategy_class(stage.algo.name).sample_kind == "prompt":
            online.append(name)
    if online and "accuracy_initial" in results[online[0]]:
        results["accuracy_before_rl"] = results[online[0]]["accuracy_initial"]
        results["accuracy_after_rl"] = results[online[-1]]["accuracy"]
    results["wall_seconds"] = round(time.time() - start, 1)
    results["checkpoint"] = previous
    results["run_dir"] = str(top)
    write_results(top, results)
    draw_stages_report(top, results["stages"])
    print_results(_summary(results, stages))
    return results


def _summary(results: dict[str, Any], stages) -> dict[str, Any]:
    """The flat table printed at the end: per stage its strategy, steps, accuracy and time."""
    rows: dict[str, Any] = {}
    for name, _ in stages:
        stage = results[name]
        rows[f"{name}: strategy"] = stage["strategy"]
        rows[f"{name}: steps"] = stage["steps"]
        if "accuracy" in stage:
            rows[f"{name}: accuracy (start)"] = stage["accuracy_initial"]
            rows[f"{name}: accuracy (end)"] = stage["accuracy"]
        rows[f"{name}: wall_seconds"] = stage["wall_seconds"]
    for key in ("accuracy_before_rl", "accuracy_after_rl", "wall_seconds", "checkpoint"):
        if key in results:
            rows[key] = results[key]
    return rows

"""Runs of several stages, one after the other: e.g. the default recipe, SFT then online RL.

``config.stages`` maps stage names, in order, to overrides of the config's sections (the
command line's values already folded in, see :mod:`ardea.config.precedence`). Every stage
config is built and checked (:func:`ardea.trainer.checks.check_config`: strategy, task,
reward functions, model directory) before the first stage starts (a typo in the last stage
fails in seconds, not after the first stage's minutes). Stage ``k`` then runs as an
ordinary run in ``<run dir>/<name>/`` (its own ``config.yaml``, metrics, checkpoints,
report) and starts from the final policy of stage ``k − 1`` unless it sets ``model.path``
(``stage:<name>`` there, or in a reward function's ``kwargs.path``, names an earlier stage's
final model: :mod:`ardea.trainer.stage_refs`).

The run directory itself gets the full ``config.yaml`` and a ``results.json`` with each
stage's results under its name, ``wall_seconds`` for the whole run and, when the run has
online RL stages, ``accuracy_before_rl`` (held-out accuracy when the first online stage
started) and ``accuracy_after_rl`` (when the last one ended); agent runs
(``agent.env``) likewise get ``success_before_rl`` and ``success_after_rl``, the held-out
success rates of greedy episodes.

``trainer.resume=auto`` continues where the run stopped: finished stages are not trained
again (their final checkpoint is reloaded and their results are read back), the stage
that was interrupted resumes from its last checkpoint, later stages start fresh. Wall
times (``wall_seconds``, the whole run's and each stage's) count this invocation only, as
for a resumed single run; ``train_seconds`` carries on across resumes.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ardea.config import ArdeaConfig, stage_configs
from ardea.errors import ArdeaError
from ardea.trainer.checks import check_config
from ardea.trainer.distributed import is_main_process
from ardea.trainer.loop import Trainer
from ardea.trainer.report import draw_stages_report
from ardea.trainer.results import print_results, write_results
from ardea.trainer.run_dirs import (
    announce,
    claim_run_directory,
    prepare_run_directory,
    run_directory,
)
from ardea.trainer.stage_refs import check_references, resolve_references
from ardea.trainer.strategies import OnlineStrategy, strategy_class


def run(config: ArdeaConfig) -> dict[str, Any]:
    """Train ``config``: one run, or its stages in order; returns the results.

    The run's directory is claimed first (:func:`~ardea.trainer.run_dirs.claim_run_directory`:
    a new one beside a run it would overwrite). Every name the config gives (strategy, task, reward functions, model directory) is
    checked first, for every stage, before anything is trained or written.
    """
    try:
        config, note = claim_run_directory(config)
        announce(note)
        if not config.stages:
            check_config(config)
            return Trainer(config).train()
        return run_stages(config)
    finally:
        if torch.distributed.is_initialized():  # set up by a torchrun launch's first Trainer
            torch.distributed.destroy_process_group()


def plan_stages(config: ArdeaConfig) -> list[tuple[str, ArdeaConfig]]:
    """Every stage's config, validated (:func:`check_config`), with its output directory set.

    Raises:
        ArdeaError: the first problem of any stage, its message ending in ``(stages.NAME)``.
    """
    top = run_directory(config)
    stages = stage_configs(config)
    for index, (name, stage) in enumerate(stages):
        try:
            references = check_references(stage, [n for n, _ in stages[:index]])
            fields = {ref.field for ref in references}
            check_config(
                stage,
                model_path=not (
                    "model.path" in fields or starts_from_previous(config, name, index)
                ),
                teacher_path="algo.teacher.path" not in fields,
                deferred={ref.function for ref in references if ref.function is not None},
            )
        except ArdeaError as exc:
            raise type(exc)(f"{exc} (stages.{name})") from exc
        stage.trainer.output_dir = str(top / name)
        stage.trainer.resume = config.trainer.resume
    return stages


def starts_from_previous(config: ArdeaConfig, name: str, index: int) -> bool:
    """Whether stage ``name`` (at ``index``) starts from the previous stage's final policy:
    every stage but the first, unless it sets its own ``model.path``."""
    model = config.stages[name].get("model") or {}
    return index > 0 and "path" not in model


def run_stages(config: ArdeaConfig) -> dict[str, Any]:
    start = time.time()
    stages = plan_stages(config)
    top = run_directory(config)
    results: dict[str, Any] = {"stages": [name for name, _ in stages]}
    previous: str | None = None
    online: list[str] = []
    checkpoints: dict[str, str] = {}  # stage name → its final policy directory
    for index, (name, stage) in enumerate(stages):
        if starts_from_previous(config, name, index):
            stage.model.path = previous
        resolve_references(stage, checkpoints)
        trainer = Trainer(stage)  # checks the stage's model and data before anything is written
        main = is_main_process()  # under torchrun only rank 0 prints and writes
        if main:
            print(f"[ardea] stage {name!r}: {stage.algo.name}, {stage.trainer.max_steps} steps")
        if index == 0 and main:
            prepare_run_directory(config)
        outcome = trainer.train()
        results[name] = outcome
        previous = outcome["checkpoint"]
        if previous is not None:
            checkpoints[name] = previous
        if issubclass(strategy_class(stage.algo.name), OnlineStrategy):
            online.append(name)
    if not is_main_process():
        return {"checkpoint": previous}
    if online and "accuracy_initial" in results[online[0]]:
        results["accuracy_before_rl"] = results[online[0]]["accuracy_initial"]
        results["accuracy_after_rl"] = results[online[-1]]["accuracy"]
    if online and "success_initial" in results[online[0]]:  # agent runs
        results["success_before_rl"] = results[online[0]]["success_initial"]
        results["success_after_rl"] = results[online[-1]]["success"]
    results["wall_seconds"] = round(time.time() - start, 1)
    results["checkpoint"] = previous
    results["run_dir"] = str(top)
    write_results(top, results)
    if config.logging.report:
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
    keys = ("accuracy_before_rl", "accuracy_after_rl", "success_before_rl", "success_after_rl")
    for key in (*keys, "wall_seconds", "checkpoint"):
        if key in results:
            rows[key] = results[key]
    return rows

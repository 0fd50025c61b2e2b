"""``report.png``: the curves of a run, drawn from its ``metrics.jsonl``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402

from ardea.trainer.metrics_log import read_metrics  # noqa: E402

# (metric name, panel title); a panel is drawn when its metric was logged.
PANELS = [
    ("train/loss", "training loss"),
    ("eval/accuracy", "held-out accuracy (greedy)"),
    ("eval/success_rate", "held-out success rate (greedy episodes)"),
    ("agent/success_rate", "episode success rate (sampled)"),
    ("agent/turns_per_episode", "turns per episode"),
    ("rollout/reward_mean", "reward"),
    ("rollout/accuracy", "rollout accuracy (sampled)"),
    ("train/kl", "KL to reference"),
    ("loss/value", "critic value loss"),
    ("critic/explained_variance", "critic explained variance"),
    ("train/entropy", "entropy"),
    ("train/grad_norm", "gradient norm"),
    ("train/lr", "learning rate"),
    ("perf/tokens_per_s", "training tokens/s"),
]


#: the sampled held-out metrics (trainer.eval_samples), drawn together in one panel
SAMPLED = re.compile(r"eval/(avg|pass|maj)@\d+")


def _points(records: list[dict], name: str) -> list[tuple[int, float]]:
    return [(r["step"], r[name]) for r in records if isinstance(r.get(name), (int, float))]


def _panels(records: list[dict]) -> dict[str, tuple[str, dict[str, list]]]:
    """``{panel: (title, {line label: points})}`` of the metrics ``records`` hold."""
    panels = {}
    for name, title in PANELS:
        if points := _points(records, name):
            panels[name] = (title, {name: points})
        if name == "eval/accuracy":  # the sampled metrics right after the greedy accuracy
            names = sorted({k for r in records for k in r if SAMPLED.fullmatch(k)})
            if names:
                lines = {n.removeprefix("eval/"): _points(records, n) for n in names}
                panels["eval/sampled"] = ("held-out accuracy (sampled, ± 1 s.e.)", lines)
    return panels


def draw_report(run_dir: str | Path) -> Path:
    """Draw every available panel into ``<run_dir>/report.png`` and return its path."""
    run_dir = Path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.is_file():
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir}; is it a run directory?")
    records = read_metrics(metrics_path)
    panels = _panels(records)
    if not panels:
        raise ValueError(f"{metrics_path} holds no plottable metrics")
    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.2 * rows), squeeze=False)
    for ax, (name, (title, lines)) in zip(axes.flat, panels.items()):
        for label, points in lines.items():
            steps, values = zip(*points)
            ax.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3,
                    label=label if len(lines) > 1 else None)  # fmt: skip
            errors = dict(_points(records, f"eval/{label}_se"))
            if name == "eval/sampled" and len(errors) == len(points):
                low = [v - errors[s] for s, v in points]
                high = [v + errors[s] for s, v in points]
                ax.fill_between(steps, low, high, alpha=0.2)
        if len(lines) > 1:
            ax.legend()
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        values = [v for points in lines.values() for _, v in points]
        if name == "train/loss" and min(values) > 0:
            ax.set_yscale("log")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    return _save(fig, run_dir)


def draw_stages_report(run_dir: str | Path, stages: list[str]) -> Path:
    """``<run_dir>/report.png`` of a staged run: held-out accuracy (agent runs: success rate)
    through all the stages
    (steps counted on from one stage to the next, a dashed line where a stage starts)."""
    run_dir = Path(run_dir)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    offset = 0
    records_of = {name: read_metrics(run_dir / name / "metrics.jsonl") for name in stages}
    every = [r for records in records_of.values() for r in records]
    metric = (
        "eval/success_rate" if any("eval/success_rate" in r for r in every) else "eval/accuracy"
    )
    for name in stages:
        records = records_of[name]
        points = [(offset + r["step"], r[metric]) for r in records if metric in r]
        if points:
            steps, values = zip(*points)
            ax.plot(steps, values, marker="o", markersize=3, label=name)
        if offset:
            ax.axvline(offset, color="grey", linestyle="--", linewidth=0.8)
        offset += max((r["step"] for r in records), default=0)
    what = "success rate" if metric == "eval/success_rate" else "accuracy"
    ax.set_title(f"held-out {what} (greedy) through the stages")
    ax.set_xlabel("step (stages one after the other)")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, run_dir)


def _save(fig: Any, run_dir: Path) -> Path:
    """Title ``fig`` with the run's name and write it to ``<run_dir>/report.png``."""
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out = run_dir / "report.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

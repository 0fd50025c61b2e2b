"""Metrics to ``metrics.jsonl`` (always), TensorBoard and Weights & Biases (optional).

Each JSONL line is one record ``{"step": int, "time": seconds since the logger started,
name: value, ...}`` with namespaced names (``train/``, ``eval/``, ``perf/``); see
docs/reference/metrics.md. A resumed run first cuts the file back to the checkpoint's step, so the
file of a resumed run holds the same records as that of an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from ardea.errors import ArdeaError


class MetricsLogger:
    """Appends metric records to every configured sink."""

    def __init__(
        self,
        run_dir: Path,
        *,
        tensorboard: bool = True,
        wandb: dict[str, Any] | None = None,
        resume_step: int | None = None,
    ) -> None:
        run_dir = Path(run_dir)
        self.path = run_dir / "metrics.jsonl"
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            truncate_metrics(self.path, resume_step)
        elif self.path.exists():
            self.path.unlink()  # a fresh run in a reused directory starts a fresh file
        self._file = self.path.open("a", encoding="utf-8")
        self._start = time.time()
        self._writer = None
        self._wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge)
        if wandb is not None:
            self._wandb = _start_wandb(run_dir, **wandb)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record: dict[str, Any] = {"step": step, "time": round(time.time() - self._start, 3)}
        for name, value in metrics.items():
            value = float(value)
            record[name] = value if math.isfinite(value) else str(value)
            if self._writer is not None:
                self._writer.add_scalar(name, value, step)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if k != "time"}, step=step)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
        if self._writer is not None:
            self._writer.close()
        if self._wandb is not None:
            self._wandb.finish()


def _start_wandb(run_dir: Path, *, project: str, mode: str, name: str, config: dict[str, Any]):
    try:
        import wandb
    except ImportError as exc:
        raise ArdeaError(
            "logging.wandb=true but wandb is not installed; pip install 'ardea[wandb]'"
        ) from exc
    return wandb.init(
        project=project, mode=mode, name=name, dir=str(run_dir), config=config, resume="allow"
    )


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl``; a torn last line (killed run) is skipped."""
    records = []
    with Path(path).open(encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def truncate_metrics(path: Path, step: int) -> None:
    """Keep only records with ``record["step"] <= step`` (drops a torn last line too)."""
    path = Path(path)
    if not path.exists():
        return
    kept = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    tmp.replace(path)


def wandb_settings(config: Any) -> dict[str, Any] | None:
    """The Weights & Biases settings of ``config`` (``logging.wandb*``), None when it is off."""
    log = config.logging
    if not log.wandb:
        return None
    from omegaconf import OmegaConf

    return {
        "project": log.wandb_project,
        "mode": log.wandb_mode,
        "name": config.trainer.run_name,
        "config": OmegaConf.to_container(OmegaConf.structured(config)),
    }


def open_logs(run_dir: Path, config: Any, resumed_at: int | None) -> MetricsLogger:
    """A run's metrics logger; ``samples.jsonl`` emptied, or cut back to ``resumed_at``
    (the step a resumed run continues from: what the killed run wrote after it goes)."""
    logger = MetricsLogger(
        run_dir,
        tensorboard=config.logging.tensorboard,
        wandb=wandb_settings(config),
        resume_step=resumed_at,
    )
    samples = Path(run_dir) / "samples.jsonl"
    if resumed_at is not None:
        truncate_metrics(samples, resumed_at)
    elif samples.exists():
        samples.unlink()
    return logger

"""A rich progress bar for training: step, loss, tokens/s and ETA."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class TrainingProgress:
    """Context manager; ``update(step, loss=..., tokens_per_s=...)`` after each step."""

    def __init__(
        self,
        total: int,
        *,
        start: int = 0,
        enabled: bool = True,
        description: str = "train",
        quiet: bool = False,
    ):
        """``enabled``: show the bar; ``quiet``: print nothing at all (the ranks other than
        0 under torchrun)."""
        self.console = Console(stderr=True, quiet=quiet)
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[speed]} tok/s"),
            TextColumn("{task.fields[extra]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not enabled,
            transient=False,
        )
        self._task = self._progress.add_task(
            description, total=total, completed=start, loss="-", speed="-", extra=""
        )

    def __enter__(self) -> TrainingProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, step: int, *, loss: float, tokens_per_s: float, extra: str = "") -> None:
        self._progress.update(
            self._task,
            completed=step,
            loss=f"{loss:.4f}",
            speed=f"{tokens_per_s:,.0f}",
            extra=extra,
        )

    def print(self, message: str) -> None:
        self._progress.console.print(message, soft_wrap=True)  # one line, whatever the width

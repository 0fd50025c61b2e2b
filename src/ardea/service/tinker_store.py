"""Where the Tinker API's saved weights live on disk, and their ``tinker://`` names.

``tinker://<model_id>/weights/<name>`` (``save_state``: an ardea checkpoint with the
optimizer state) and ``tinker://<model_id>/sampler_weights/<name>``
(``save_weights_for_sampler``: the merged model in ``policy/`` and the adapter in
``adapter/``) are the directories ``<root>/<model_id>/weights/<name>`` and
``<root>/<model_id>/sampler_weights/<name>``; ``<root>/<model_id>/run.json`` records the
base model and the LoRA layout, so a later server (same ``--state-dir``) resumes from them.
Model ids are ``<session>:train:<n>``; names may not hold ``/``.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ardea.service.tinker_wire import WireError
from ardea.trainer.checkpoint import checkpoint_problem

KINDS = {"weights": "training", "sampler_weights": "sampler"}
_NAME = re.compile(r"[A-Za-z0-9_.\-:]+")


@dataclass(frozen=True)
class TinkerPath:
    model_id: str
    kind: str  # "weights" or "sampler_weights"
    name: str

    @classmethod
    def parse(cls, path: str) -> TinkerPath:
        parts = path.removeprefix("tinker://").split("/") if path.startswith("tinker://") else []
        if len(parts) != 3 or parts[1] not in KINDS or not all(parts):
            raise WireError(
                f"{path!r} is not a tinker://<model_id>/weights|sampler_weights/<name> path"
            )
        return cls(*parts)

    def __str__(self) -> str:
        return f"tinker://{self.model_id}/{self.kind}/{self.name}"


def iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class Store:
    """The state directory (``ardea serve --tinker --state-dir``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def directory(self, path: TinkerPath) -> Path:
        return self.root / path.model_id / path.kind / path.name

    def new_path(self, model_id: str, kind: str, name: str) -> TinkerPath:
        if not _NAME.fullmatch(name):
            raise WireError(f"checkpoint name {name!r} must be letters, digits, '_', '-', '.'")
        return TinkerPath(model_id, kind, name)

    def existing(self, path: str) -> tuple[TinkerPath, Path]:
        """The parsed path and its directory, which must hold a complete save."""
        parsed = TinkerPath.parse(path)
        directory = self.directory(parsed)
        if not directory.is_dir():
            raise WireError(f"no saved weights at {path} (looked in {directory})")
        problem = checkpoint_problem(directory) if parsed.kind == "weights" else None
        if problem is not None:
            raise WireError(f"the state at {path} cannot be loaded: {problem}")
        return parsed, directory

    def write_run(self, model_id: str, record: dict[str, Any]) -> None:
        run = self.root / model_id
        run.mkdir(parents=True, exist_ok=True)
        (run / "run.json").write_text(json.dumps(record, indent=1))

    def run(self, model_id: str) -> dict[str, Any]:
        file = self.root / model_id / "run.json"
        if not file.is_file():
            raise WireError(f"unknown training run {model_id!r}")
        return json.loads(file.read_text())

    def checkpoints(self, model_id: str) -> list[dict[str, Any]]:
        """The saved weights of a run, as the REST API lists them (oldest first)."""
        found = []
        for kind, kind_name in KINDS.items():
            for directory in sorted((self.root / model_id / kind).glob("*")):
                if directory.name.startswith("."):  # a save in progress
                    continue
                size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
                found.append({
                    "checkpoint_id": f"{kind}/{directory.name}",
                    "checkpoint_type": kind_name,
                    "time": iso(directory.stat().st_mtime),
                    "tinker_path": str(TinkerPath(model_id, kind, directory.name)),
                    "size_bytes": size,
                    "public": False,
                })  # fmt: skip
        return sorted(found, key=lambda c: c["time"])

    def delete(self, model_id: str, checkpoint_id: str) -> None:
        kind, _, name = checkpoint_id.partition("/")
        directory = self.directory(TinkerPath(model_id, kind, name)) if kind in KINDS else None
        if directory is None or not directory.is_dir():
            raise WireError(f"no checkpoint {checkpoint_id!r} in run {model_id!r}")
        shutil.rmtree(directory)

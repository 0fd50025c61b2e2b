"""Where the Tinker API's saved weights live on disk, and their ``tinker://`` names.

``tinker://<model_id>/weights/<name>`` (``save_state``: an ardea checkpoint with the
optimizer state) and ``tinker://<model_id>/sampler_weights/<name>``
(``save_weights_for_sampler``: the merged model in ``policy/`` and the adapter in
``adapter/``) are the directories ``<root>/<model_id>/weights/<name>`` and
``<root>/<model_id>/sampler_weights/<name>``; ``<root>/<model_id>/run.json`` records the
base model and the LoRA layout, so a later server (same ``--state-dir``) resumes from them.

No name from a request is trusted as a path: model ids and names match the patterns of
:mod:`tinker_fields` (no ``/``, no leading dot), and every directory is resolved (symlinks
included) and must lie inside the root. A save is written to a ``.tmp_*`` directory,
sealed with each file's size and SHA-256 and renamed into place; a load verifies them; a
delete removes only a sealed save; temporary directories a crash left are removed at start.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ardea.service.tinker_fields import MODEL_ID, NAME, shown
from ardea.service.tinker_wire import WireError
from ardea.trainer.checkpoint import COMPLETE_MARKER, checkpoint_problem, seal

KINDS = {"weights": "training", "sampler_weights": "sampler"}
PATH_FORM = "tinker://<model_id>/weights|sampler_weights/<name>"


def check_model_id(model_id: Any, at: str = "model_id") -> str:
    if not isinstance(model_id, str) or not MODEL_ID.fullmatch(model_id):
        raise WireError(f"{at}={shown(model_id)} is not a model id (<session>:train:<n>)")
    return model_id


@dataclass(frozen=True)
class TinkerPath:
    model_id: str
    kind: str  # "weights" or "sampler_weights"
    name: str

    @classmethod
    def parse(cls, path: Any, at: str = "path") -> TinkerPath:
        parts = []
        if isinstance(path, str) and path.startswith("tinker://") and len(path) <= 512:
            parts = path.removeprefix("tinker://").split("/")
        ok = len(parts) == 3 and bool(MODEL_ID.fullmatch(parts[0])) and parts[1] in KINDS
        if not (ok and NAME.fullmatch(parts[2])):
            raise WireError(f"{at}={shown(path)} is not a {PATH_FORM} path")
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
        self.real_root = self.root.resolve()
        for leftover in self.root.glob("*/*/.tmp_*"):  # saves a crash cut short
            if leftover.parent.name in KINDS and leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover)
                print(f"ardea tinker: removed {leftover}, a save that never finished",
                      file=sys.stderr)  # fmt: skip

    def _inside(self, *parts: str) -> Path:
        """``root/parts...``, which must resolve (symlinks followed) inside the root."""
        path = self.root.joinpath(*parts)
        if not path.resolve().is_relative_to(self.real_root):
            raise WireError(f"{'/'.join(parts)!r} resolves outside the state directory")
        return path

    def directory(self, path: TinkerPath) -> Path:
        return self._inside(path.model_id, path.kind, path.name)

    def new_path(self, model_id: str, kind: str, name: Any, at: str = "path") -> TinkerPath:
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise WireError(f"{at}={shown(name)}: a checkpoint name is letters, digits, '_', "
                            "'-', and inner '.' or ':' (at most 128; no '/', no leading dot)")  # fmt: skip
        return TinkerPath(check_model_id(model_id), kind, name)

    def save(self, path: TinkerPath, write: Callable[[Path], Any]) -> None:
        """Write a save atomically: ``write(tmp)`` fills a temporary directory, which is
        sealed (sizes and SHA-256) and renamed to ``path``'s directory."""
        final = self.directory(path)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp_{final.name}_{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        write(tmp)
        seal(tmp, 0, checksums=True)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)

    def existing(self, path: Any, at: str = "path") -> tuple[TinkerPath, Path]:
        """The parsed path and its directory, which must hold a complete, unchanged save."""
        parsed = TinkerPath.parse(path, at)
        directory = self.directory(parsed)
        if not directory.is_dir():
            raise WireError(f"no saved weights at {path} (looked in {directory})")
        problem = checkpoint_problem(directory, verify=True)
        if problem is not None:
            raise WireError(f"the state at {path} cannot be loaded: {problem}")
        return parsed, directory

    def write_run(self, model_id: str, record: dict[str, Any]) -> None:
        run = self._inside(check_model_id(model_id))
        run.mkdir(parents=True, exist_ok=True)
        (run / "run.json").write_text(json.dumps(record, indent=1))

    def run(self, model_id: Any) -> dict[str, Any]:
        file = self._inside(check_model_id(model_id), "run.json")
        if not file.is_file():
            raise WireError(f"unknown training run {model_id!r}")
        return json.loads(file.read_text())

    def checkpoints(self, model_id: Any) -> list[dict[str, Any]]:
        """The saved weights of a run, as the REST API lists them (oldest first)."""
        found = []
        for kind, kind_name in KINDS.items():
            for directory in sorted(self._inside(check_model_id(model_id), kind).glob("*")):
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

    def delete(self, model_id: Any, checkpoint_id: Any) -> None:
        """Remove a save ardea sealed; anything else is refused."""
        kind, _, name = (
            checkpoint_id.partition("/") if isinstance(checkpoint_id, str) else ("",) * 3
        )
        if kind not in KINDS:
            raise WireError(f"checkpoint_id={shown(checkpoint_id)} is not weights/<name> or "
                            "sampler_weights/<name>")  # fmt: skip
        directory = self.directory(self.new_path(model_id, kind, name, at="checkpoint_id"))
        if directory.is_symlink() or not (directory / COMPLETE_MARKER).is_file():
            raise WireError(f"no checkpoint {checkpoint_id!r} in run {model_id!r}")
        shutil.rmtree(directory)

"""Checkpoints: ``checkpoints/step_XXXXXXX/`` with ``policy/`` (Hugging Face format,
safetensors; for LoRA the merged model, with the adapter alone in ``adapter/``),
``critic/`` for critic-based PPO (a ``ValueModel`` in Hugging Face token-classification
format) and ``trainer_state.pt`` (optimizer, scheduler, RNG, data position); under FSDP2
``shards/`` with each rank's parameters and optimizer moments
(:mod:`ardea.trainer.shard_files`), the optimizer's moments then not in the trainer state.

A checkpoint is written into a temporary directory, marked complete, then renamed
into place, so a killed process never leaves a half-written ``step_*`` directory.
``trainer_state.pt`` holds only tensors and plain containers and is read with
``torch.load(weights_only=True)``: loading never unpickles arbitrary objects.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ardea.model.lora import save_policy

COMPLETE_MARKER = "COMPLETE"
STATE_FILE = "trainer_state.pt"


BEST_DIR = "best"  # checkpoints/best/: trainer.keep_best's checkpoint (never pruned or resumed)


def checkpoint_dir(run_dir: Path, step: int | str) -> Path:
    """``checkpoints/step_XXXXXXX`` of a step, or ``checkpoints/<name>`` (e.g. BEST_DIR)."""
    name = step if isinstance(step, str) else f"step_{step:07d}"
    return Path(run_dir) / "checkpoints" / name


def temporary_dir(final: Path) -> Path:
    """Where ``final``'s checkpoint is written before it is renamed into place: the same
    name on every node (every rank writes its shard file there)."""
    return Path(final).parent / f".tmp_{Path(final).name}"


def begin_checkpoint(final: Path) -> Path:
    """:func:`temporary_dir` of ``final``, fresh: emptied of whatever a killed run left."""
    tmp = temporary_dir(final)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def write_checkpoint(
    tmp: Path,
    *,
    policy: Any,
    tokenizer: Any,
    state: dict[str, Any],
    policy_state: dict[str, torch.Tensor] | None = None,
    save_extra: Callable[[Path], None] | None = None,
) -> None:
    """Write the policy's Hugging Face export (``policy/``), ``trainer_state.pt`` and, by
    ``save_extra``, further modules (a PPO critic's ``critic/``) into ``tmp``.
    ``policy_state``: the policy's whole weights when its own are shards (gathered by the
    caller)."""
    save_policy(policy, tokenizer, tmp, state_dict=policy_state)
    torch.save(state, tmp / STATE_FILE)
    if save_extra is not None:
        save_extra(tmp)


def finish_checkpoint(tmp: Path, final: Path, step: int, *, run_dir: Path, keep_last: int) -> Path:
    """Seal ``tmp`` (every file it holds), rename it into place as ``final`` (replacing what
    is there, e.g. ``checkpoints/best``) and prune ``run_dir``'s checkpoints to the last
    ``keep_last``; ``final``. A killed process never leaves a half-written ``step_*``."""
    seal(tmp, step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    prune_checkpoints(run_dir, keep_last)
    return final


def seal(directory: Path, step: int, *, checksums: bool = False) -> None:
    """Mark ``directory`` complete: the marker lists every file with its size (and SHA-256
    with ``checksums``), so a checkpoint whose files were cut short, removed or overwritten
    afterwards is recognised as damaged and never loaded."""
    marker: dict[str, Any] = {"step": step, "files": _file_sizes(directory)}
    if checksums:
        marker["sha256"] = {name: _sha256(directory / name) for name in marker["files"]}
    (directory / COMPLETE_MARKER).write_text(json.dumps(marker))


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_sizes(directory: Path) -> dict[str, int]:
    return {
        str(f.relative_to(directory)): f.stat().st_size
        for f in sorted(directory.rglob("*"))
        if f.is_file() and f.name != COMPLETE_MARKER
    }


def checkpoint_problem(path: Path, *, verify: bool = False) -> str | None:
    """Why ``path`` is not a complete, intact checkpoint (None when it is); ``verify``: also
    check the files' SHA-256 where the marker has them."""
    marker = path / COMPLETE_MARKER
    if not marker.is_file():
        return "no COMPLETE marker (the write was interrupted)"
    try:
        sealed = json.loads(marker.read_text())
        expected, sums = dict(sealed["files"]), dict(sealed.get("sha256") or {})
    except (ValueError, KeyError, TypeError):
        return "its COMPLETE marker is unreadable"
    actual = _file_sizes(path)
    for name, size in expected.items():
        if actual.get(name) != size:
            return f"{name} is missing or has the wrong size"
    for name, digest in sums.items() if verify else ():
        if _sha256(path / name) != digest:
            return f"{name} does not match its SHA-256 (changed after it was saved)"
    return None


_announced: set[Path] = set()  # damaged checkpoints already reported (once each)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first; a damaged one is skipped and said so in one line
    on stderr (once per checkpoint)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.glob("step_*")):
        problem = checkpoint_problem(path)
        if problem is None:
            found.append(path)
        else:
            if path not in _announced:
                _announced.add(path)
                print(f"ardea: skipping checkpoint {path}: {problem}", file=sys.stderr)
    return found


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def prune_checkpoints(run_dir: Path, keep_last: int) -> None:
    for path in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    return torch.load(Path(checkpoint) / STATE_FILE, map_location="cpu", weights_only=True)

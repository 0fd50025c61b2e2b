"""Run directories: where a run writes, and never over another run.

A run directory (``trainer.output_dir``, else ``runs/<trainer.run_name>``) holds one run:
its resolved ``config.yaml``, metrics, checkpoints and ``results.json``. Before anything is
written, :func:`claim_run_directory` decides where this run goes:

- a new or empty directory (no ``config.yaml``, no ``checkpoints/``): there;
- a directory holding a run, under ``trainer.resume=auto``: there, to continue that run, when
  the two configs agree on everything but the keys a continuation may change
  (:data:`CONTINUATION_KEYS`: step counts, cadences, the early stop, threads, logging);
  otherwise an error naming the first difference and the override that continues the run;
- a directory holding a run, for a run that starts afresh (``trainer.resume=never``, or a
  checkpoint path): a directory named by ``trainer.run_name`` gives way to the first free
  ``runs/<name>-2``, ``runs/<name>-3``, ..., said in a line at the start with the first
  difference from the run there; a ``trainer.output_dir`` the user named is not renamed: an
  error says what to do.

Configs are compared as the flattened keys of their YAML (``stages.rl.trainer.max_steps``);
``trainer.run_name``, ``trainer.output_dir`` and ``trainer.resume`` say where a run goes, not
what it is, and are left out. A section key only one side has comes from another ardea
version and is left out too; inside ``stages`` (overrides, not full sections) it counts.
"""

from __future__ import annotations

import dataclasses
import json
import os
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import yaml

from ardea.config import ArdeaConfig, config_to_yaml
from ardea.errors import ArdeaError

#: where a run goes, not what it is
LOCATION_KEYS = ("trainer.run_name", "trainer.output_dir", "trainer.resume")
#: keys ``trainer.resume=auto`` may continue a run with other values of (in any stage)
CONTINUATION_KEYS = (
    "trainer.max_steps",
    "trainer.max_train_seconds",
    "trainer.eval_every",
    "trainer.save_every",
    "trainer.keep_last",
    "trainer.early_stop_*",
    "trainer.num_threads",
    "trainer.device",
    "trainer.distributed",
    "trainer.dist_timeout_s",
    "logging.*",
)


def run_directory(config: ArdeaConfig) -> Path:
    return Path(config.trainer.output_dir or Path("runs") / config.trainer.run_name)


def prepare_run_directory(config: ArdeaConfig) -> Path:
    """Create the run directory and write the fully resolved ``config.yaml`` into it."""
    run_dir = run_directory(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_to_yaml(config), encoding="utf-8")
    return run_dir


def holds_run(directory: Path) -> bool:
    return (directory / "config.yaml").is_file() or (directory / "checkpoints").is_dir()


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": {}}`` → ``{"a.b": 1}`` (lists stay values)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out |= flat(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def config_differences(held: dict, wanted: dict) -> list[tuple[str, Any, Any]]:
    """``(key, held value, wanted value)`` for every key the two configs (YAML trees) set
    differently, in ``wanted``'s key order (module docstring: what is left out)."""
    there, here = flat(held), flat(wanted)
    missing = object()
    differences = []
    for key in [*here, *(k for k in there if k not in here)]:
        old, new = there.get(key, missing), here.get(key, missing)
        if key in LOCATION_KEYS or old == new:
            continue
        if (old is missing or new is missing) and not key.startswith("stages."):
            continue  # a key of another ardea version
        differences.append((key, None if old is missing else old, None if new is missing else new))
    return differences


def continuation_key(key: str) -> bool:
    """Whether ``key`` (``stages.NAME.`` stripped) may change when a run continues."""
    parts = key.split(".")
    bare = ".".join(parts[2:]) if parts[0] == "stages" else key
    return any(fnmatch(bare, pattern) for pattern in CONTINUATION_KEYS)


def shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def claim_run_directory(config: ArdeaConfig) -> tuple[ArdeaConfig, str | None]:
    """The config with the directory this run writes to, and the line that says why when it
    is not the one asked for (module docstring). Nothing is written.

    Raises:
        ArdeaError: a named ``trainer.output_dir`` holds another run, or ``trainer.resume=auto``
            would continue a run of another config.
    """
    directory = run_directory(config)
    if not holds_run(directory):
        return config, None
    held_file = directory / "config.yaml"
    held = yaml.safe_load(held_file.read_text(encoding="utf-8")) if held_file.is_file() else {}
    wanted = yaml.safe_load(config_to_yaml(config))
    differences = config_differences(held, wanted) if held else []
    if config.trainer.resume == "auto":
        blocking = [d for d in differences if not continuation_key(d[0])]
        if blocking:
            key, old, new = blocking[0]
            raise ArdeaError(
                f"trainer.resume=auto: {directory} holds a run of another config ({key} is "
                f"{shown(old)} there, {shown(new)} here); give {key}={shown(old)} to continue "
                f"it, or leave trainer.resume=auto out to start a new run beside it"
            )
        return config, None
    what = (
        f"another run ({differences[0][0]} is {shown(differences[0][1])} there, "
        f"{shown(differences[0][2])} here)"
        if differences
        else "a run of this config"
        if held
        else "a run without its config.yaml"
    )
    if config.trainer.output_dir:
        raise ArdeaError(
            f"trainer.output_dir={config.trainer.output_dir} holds {what}; continue it with "
            "trainer.resume=auto, or choose another trainer.output_dir"
        )
    number = 2
    while holds_run(directory.with_name(f"{directory.name}-{number}")):
        number += 1
    free = directory.with_name(f"{directory.name}-{number}")
    trainer = dataclasses.replace(config.trainer, output_dir=str(free))
    note = (
        f"{directory} holds {what}; this run writes to {free} "
        f"(trainer.resume=auto continues the one in {directory})"
    )
    return dataclasses.replace(config, trainer=trainer), note


def announce(note: str | None) -> None:
    """Print ``note`` once: on rank 0 of a torchrun launch (which has not set up its process
    group yet), or in the only process."""
    if note is not None and os.environ.get("RANK", "0") == "0":
        print(f"[ardea] {note}", flush=True)

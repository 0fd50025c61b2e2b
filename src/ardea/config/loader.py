"""Load an :class:`ArdeaConfig` from YAML plus ``key=value`` dotted overrides.

Precedence, lowest first: the dataclass defaults, the YAML file's top level, its
``stages.NAME`` values, the command-line overrides (which reach every stage, see
:mod:`ardea.config.precedence`). OmegaConf checks keys and types against the dataclasses;
the dataclasses' ``__post_init__`` checks values. Every failure becomes one
:class:`ConfigError` line naming the field.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from ardea.config.precedence import apply_to_stages, run_level_keys
from ardea.config.schema import ArdeaConfig
from ardea.errors import ConfigError

#: what ``ardea train`` runs without a config file: SFT on scarce demonstrations, then online RL
DEFAULT_RECIPE = Path(__file__).with_name("default_recipe.yaml")


def _first_line(exc: Exception) -> str:
    return str(getattr(exc, "msg", None) or exc).splitlines()[0]


def _section_keys(full_key: str) -> tuple[str, list[str]]:
    """The dotted parent of ``full_key`` and the keys allowed there."""
    parent = full_key.split(".")[:-1]
    node: Any = ArdeaConfig()
    for part in parent:
        node = getattr(node, part, None)
    allowed = [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else []
    return ".".join(parent), allowed


def _section_type(dotted: str) -> type | None:
    node: Any = ArdeaConfig()
    for part in dotted.split(".") if dotted else []:
        node = getattr(node, part, None)
    return type(node) if dataclasses.is_dataclass(node) else None


def _translate(exc: OmegaConfBaseException, source: str) -> ConfigError:
    full_key = str(getattr(exc, "full_key", "") or getattr(exc, "key", "") or "?")
    if isinstance(exc, ConfigKeyError):
        parent, allowed = _section_keys(full_key)
        where = f"in '{parent}'" if parent else "at the top level"
        owner = getattr(exc, "object_type", None)
        if dataclasses.is_dataclass(owner) and owner is not _section_type(parent):
            allowed = [f.name for f in dataclasses.fields(owner)]  # e.g. an entry of a list
            where = f"in {owner.__name__}"
        return ConfigError(
            f"unknown config key '{full_key}' ({source}); allowed keys {where}: {', '.join(allowed)}"
        )
    if isinstance(exc, ValidationError):
        return ConfigError(f"{full_key}: {_first_line(exc)} ({source})")
    return ConfigError(f"{full_key}: {_first_line(exc)} ({source})")


def _load_yaml(path: str | Path) -> DictConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        loaded = OmegaConf.load(path)
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_first_line(exc)}") from exc
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"config file {path} must hold a mapping of sections, got a list")
    return loaded


def _parse_overrides(overrides: list[str]) -> DictConfig:
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"override {item!r} is not of the form key=value (e.g. trainer.max_steps=100)"
            )
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        raise ConfigError(f"cannot parse overrides {overrides}: {_first_line(exc)}") from exc


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> ArdeaConfig:
    """Build the validated run config.

    Args:
        path: optional YAML file with any subset of the sections.
        overrides: ``section.field=value`` strings applied last, to the top level and,
            in a staged run, to every stage after the stage's own values.

    Raises:
        ConfigError: one line naming the offending key or value.
    """
    merged = OmegaConf.structured(ArdeaConfig)
    layers = []
    if path is not None:
        layers.append((_load_yaml(path), str(path)))
    if overrides:
        layers.append((_parse_overrides(overrides), "command line"))
    for layer, source in layers:
        merged = _merge(for_task(merged, layer), layer, source)
    if overrides and merged.stages:
        file_stages = layers[0][0].get("stages") if path is not None else None
        merged.stages = apply_to_stages(file_stages or OmegaConf.create({}), layers[-1][0])
    try:
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise _translate(exc, "config") from exc
    assert isinstance(config, ArdeaConfig)
    return config


def for_task(base: DictConfig, layer: DictConfig) -> DictConfig:
    """``base`` as ``layer`` merges over it: without its ``data.task_args`` when ``layer``
    names another ``data.task`` (they were the old task's arguments: ``data.task=countdown``
    over a config of the arithmetic task must not hand countdown ``digits``)."""
    data = layer.get("data")
    if not isinstance(data, DictConfig) or "task" not in data:
        return base
    if data.task == base.data.task or not base.data.task_args:
        return base
    out = base.copy()
    out.data.task_args = {}
    return out


def _merge(base: DictConfig, layer: DictConfig, source: str) -> DictConfig:
    """``layer`` merged over ``base``; a failure is one :class:`ConfigError` naming ``source``."""
    try:
        return OmegaConf.merge(base, layer)
    except OmegaConfBaseException as exc:
        raise _translate(exc, source) from exc
    except TypeError as exc:  # e.g. `list.0.field=...` against a list of structured configs
        raise ConfigError(
            f"cannot apply {source} values: {exc}; set a list field as a whole, "
            "e.g. reward.functions=[{name: task, weight: 2}]"
        ) from exc


def stage_configs(config: ArdeaConfig) -> list[tuple[str, ArdeaConfig]]:
    """The validated config of every stage of ``config.stages``, in order.

    A stage's config is ``config`` without its stages, overridden by the stage's mapping
    (which :func:`load_config` has already given the command-line values; same error
    messages, with the source ``stages.<name>``). Output directories and model paths are
    left to the caller.
    """
    base = OmegaConf.structured(config)
    base.stages = {}
    out = []
    for name, overrides in config.stages.items():
        source = f"stages.{name}"
        layer = OmegaConf.create(dict(overrides))
        if "stages" in layer:
            raise ConfigError(f"{source} sets 'stages'; stages cannot be nested")
        if run_level_keys(layer):
            key = run_level_keys(layer)[0]
            raise ConfigError(
                f"{source}.{key} is set for one stage, but {key} belongs to the whole run "
                f"(each stage runs in <run dir>/<name>/); set {key} at the top level"
            )
        try:
            merged = OmegaConf.merge(for_task(base, layer), layer)
            stage = OmegaConf.to_object(merged)
        except OmegaConfBaseException as exc:
            raise _translate(exc, source) from exc
        except ConfigError as exc:
            raise ConfigError(f"{exc} ({source})") from exc
        assert isinstance(stage, ArdeaConfig)
        out.append((name, stage))
    return out


def config_to_yaml(config: ArdeaConfig) -> str:
    """The fully resolved config as YAML (what ``--print-config`` prints and runs save)."""
    return OmegaConf.to_yaml(OmegaConf.structured(config))

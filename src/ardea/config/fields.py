"""Helpers for declaring and validating config fields."""

from __future__ import annotations

import math
from dataclasses import field, fields
from typing import Any

from ardea.errors import ConfigError


def option(
    default: Any = None, help: str = "", *, factory: Any = None, choices: tuple | None = None
) -> Any:
    """A dataclass field with a help text and, for a fixed set of values, its ``choices``
    (shown by ``ardea train --help-config`` and the configuration reference; checked by
    :func:`check_choices`)."""
    metadata = {"help": help} if choices is None else {"help": help, "choices": tuple(choices)}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def check_choices(config: Any, prefix: str) -> None:
    """Raise :class:`ConfigError` unless every field of the dataclass ``config`` declared
    with ``choices`` holds one of them (named ``prefix.field`` in the message)."""
    for f in fields(config):
        if "choices" in f.metadata:
            name = f"{prefix}.{f.name}" if prefix else f.name
            check_choice(name, getattr(config, f.name), f.metadata["choices"])


def check_choice(name: str, value: Any, allowed: tuple | list) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ConfigError(f"{name}={value!r} is not allowed; choose one of: {choices}")


def check_range(
    name: str,
    value: float,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """Raise :class:`ConfigError` unless ``low (<|<=) value (<|<=) high``."""
    bad_low = low is not None and (value <= low if low_open else value < low)
    bad_high = high is not None and (value >= high if high_open else value > high)
    if bad_low or bad_high:
        lo = "-inf" if low is None else f"{low}"
        hi = "inf" if high is None else f"{high}"
        interval = f"{'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"
        raise ConfigError(f"{name}={value!r} is out of range; expected a value in {interval}")


MIN_TEMPERATURE = 1e-4


def check_temperature(name: str, value: float) -> None:
    """Raise :class:`ConfigError` unless ``value`` is 0 (greedy) or a finite number >= 1e-4."""
    finite = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not finite or not math.isfinite(value) or (value != 0 and value < MIN_TEMPERATURE):
        raise ConfigError(
            f"{name}={value!r} is not allowed; use 0 (greedy) or a temperature >= {MIN_TEMPERATURE}"
        )

"""Every config key with its type, default, choices and help text, read from the config
dataclasses themselves: ``ardea train --help-config`` prints it as text and the
documentation site's configuration reference is generated from it, so neither is ever
maintained by hand.

A key of a nested section is dotted (``algo.ppo.gae_lambda``); the fields of the entries of
a list of sections are named with ``[]`` (``reward.functions[].name``).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ardea.config.schema import ArdeaConfig

__all__ = ["ConfigKey", "config_keys", "config_reference_markdown", "describe_config"]


@dataclass(frozen=True)
class ConfigKey:
    """One config key: where it lives and what it takes."""

    key: str  # the full dotted key, e.g. "algo.ppo.gae_lambda"
    type: str  # the annotation as written, e.g. "float | None"
    default: Any  # the default value (a default factory's product)
    choices: tuple | None  # the allowed values, when the field has a fixed set
    help: str  # the field's help text

    @property
    def section(self) -> str:
        """The dotted section the key belongs to ("" for a top-level key such as stages)."""
        return self.key.rpartition(".")[0]

    @property
    def name(self) -> str:
        """The key within its section."""
        return self.key.rpartition(".")[2]


def config_keys(cls: type = ArdeaConfig, prefix: str = "") -> Iterator[ConfigKey]:
    """Every leaf key of the dataclass ``cls`` (nested sections recursively), in field order."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        key = f"{prefix}{field.name}"
        nested = _section_type(hints[field.name])
        if nested is not None:
            if typing.get_origin(hints[field.name]) is list:
                yield from config_keys(nested, f"{key}[].")
            else:
                yield from config_keys(nested, f"{key}.")
            continue
        yield ConfigKey(
            key=key,
            type=str(field.type),
            default=_default(field),
            choices=field.metadata.get("choices"),
            help=field.metadata.get("help", ""),
        )


def _default(field: dataclasses.Field) -> Any:
    """The field's default value (a default factory's product); ``dataclasses.MISSING`` for a
    key the config must set."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _section_type(hint: Any) -> type | None:
    """The dataclass a field holds (itself, or the item of a list of them), else None."""
    if dataclasses.is_dataclass(hint):
        return hint
    args = typing.get_args(hint)
    if typing.get_origin(hint) is list and args and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def yaml_value(value: Any) -> str:
    """``value`` as it is written in a YAML config (JSON is YAML: null, true, [..], {..})."""
    if value is dataclasses.MISSING:
        return "(required)"
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def keys_by_section() -> dict[str, list[ConfigKey]]:
    """:func:`config_keys` grouped by section, sections in the order they first appear."""
    sections: dict[str, list[ConfigKey]] = {}
    for item in config_keys():
        sections.setdefault(item.section, []).append(item)
    return sections


def describe_config() -> str:
    """Every key with its default, choices and help, one per line, grouped by section."""
    lines: list[str] = []
    for section, items in keys_by_section().items():
        if section:
            lines.append(f"{section}:")
        for item in items:
            choices = (
                f" (one of: {', '.join(map(yaml_value, item.choices))})" if item.choices else ""
            )
            indent = "  " if section else ""
            lines.append(
                f"{indent}{item.name} = {yaml_value(item.default)}  # {item.help}{choices}"
            )
    return "\n".join(lines)


def config_reference_markdown() -> str:
    """The configuration reference page: one table of keys per section."""
    out = [
        "# Configuration reference",
        "",
        "Every key of a run's config, generated from the config dataclasses of "
        "`ardea.config` (their types, defaults, allowed values and help texts) when the site "
        "is built; `ardea train --help-config` prints the same list. Set a key in the YAML "
        "file under its section or on the command line as `section.key=value` "
        "([how](../howto/configure.md)).",
    ]
    for section, items in keys_by_section().items():
        out += ["", f"## {section or 'top level'}", "", "| key | type | default | what it is |"]
        out.append("|---|---|---|---|")
        for item in items:
            allowed = ", ".join(f"`{yaml_value(c)}`" for c in item.choices or ())
            out.append(
                f"| `{item.key}` | `{_code_cell(item.type)}` "
                f"| `{_code_cell(yaml_value(item.default))}` "
                f"| {_cell(item.help)}{f' One of: {allowed}.' if allowed else ''} |"
            )
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _code_cell(text: str) -> str:
    """``text`` safe inside a code span of a table cell (a pipe inside backticks does not
    split the cell, and a backslash there would be shown)."""
    return text.replace("`", "'").replace("\n", " ")

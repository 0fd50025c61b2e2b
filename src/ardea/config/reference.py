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

__all__ = [
    "ConfigKey",
    "ConfigSection",
    "config_keys",
    "config_reference_markdown",
    "config_sections",
    "describe_config",
]


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


@dataclass(frozen=True)
class ConfigSection:
    """One section of the config: its own help and its keys (not those of its subsections).

    A list of sections (``reward.functions``) is one section whose keys are those of each
    entry (``reward.functions[].name``); ``default`` is then the list a run gets when the
    config does not set it."""

    key: str  # the dotted section, e.g. "algo.ppo"; "" for the top level
    help: str  # the section field's help text ("" for the top level)
    keys: tuple[ConfigKey, ...]
    is_list: bool = False  # a list of entries, each with ``keys``
    default: Any = None  # a list section's default entries, as plain values

    @property
    def title(self) -> str:
        return self.key or "top level"


def config_sections(
    cls: type = ArdeaConfig, key: str = "", help: str = "", **entries: Any
) -> Iterator[ConfigSection]:
    """Every section of the dataclass ``cls`` (itself first, then its subsections in field
    order, depth first) with its help text and its own keys."""
    hints = typing.get_type_hints(cls)
    prefix = f"{key}[]." if entries.get("is_list") else f"{key}." if key else ""
    own = tuple(k for k in config_keys(cls, prefix) if k.section == prefix.removesuffix("."))
    yield ConfigSection(key=key, help=help, keys=own, **entries)
    for field in dataclasses.fields(cls):
        nested = _section_type(hints[field.name])
        if nested is None:
            continue
        sub = f"{prefix}{field.name}"
        text = field.metadata.get("help", "")
        if typing.get_origin(hints[field.name]) is list:
            default = [dataclasses.asdict(entry) for entry in _default(field)]
            yield from config_sections(nested, sub, text, is_list=True, default=default)
        else:
            yield from config_sections(nested, sub, text)


def describe_config() -> str:
    """Every key with its default, choices and help, one per line, grouped by section, each
    section with its help."""
    lines: list[str] = []
    for section in config_sections():
        indent = "  " if section.key else ""
        if section.key:
            name = f"{section.key}[]" if section.is_list else section.key
            default = f" (default: {yaml_value(section.default)})" if section.is_list else ""
            lines.append(f"{name}:  # {section.help}{default}")
        for item in section.keys:
            choices = (
                f" (one of: {', '.join(map(yaml_value, item.choices))})" if item.choices else ""
            )
            lines.append(
                f"{indent}{item.name} = {yaml_value(item.default)}  # {item.help}{choices}"
            )
    return "\n".join(lines)


def config_reference_markdown() -> str:
    """The configuration reference page: per section its help and a table of its keys (the
    top level, which holds only ``stages``, last)."""
    out = [
        "<!-- generated by scripts/gen_docs.py (make docs-gen) from the config dataclasses: "
        "do not edit by hand -->",
        "# Configuration reference",
        "",
        "Every key of a run's config, generated from the config dataclasses of "
        "`ardea.config` (their types, defaults, allowed values and help texts); "
        "`ardea train --help-config` prints the same list. Set a key in the YAML file under "
        "its section or on the command line as `section.key=value` "
        "([how](../howto/configure.md)).",
    ]
    sections = list(config_sections())
    for section in [*sections[1:], sections[0]]:
        out += ["", f"## {section.title}", ""]
        if section.help:
            out += [_paragraph(section.help), ""]
        if section.is_list:
            out += [
                f"A list: each entry is a mapping of the keys below. Default: "
                f"`{_code_cell(yaml_value(section.default))}`.",
                "",
            ]
        out += ["| key | type | default | what it is |", "|---|---|---|---|"]
        out += [_row(item) for item in section.keys]
    return "\n".join(out) + "\n"


def _row(item: ConfigKey) -> str:
    """One key's row of the reference's tables."""
    allowed = ", ".join(f"`{yaml_value(c)}`" for c in item.choices or ())
    default = (
        "required"
        if item.default is dataclasses.MISSING
        else f"`{_code_cell(yaml_value(item.default))}`"
    )
    return (
        f"| `{item.key}` | {_cell(item.type)} | {default} "
        f"| {_cell(item.help)}{f' One of: {allowed}.' if allowed else ''} |"
    )


def _paragraph(text: str) -> str:
    """A help text as one line of a Markdown paragraph: ``<`` shown, not taken for HTML
    (``runs/<run_name>``, ``<tool_call>``)."""
    return " ".join(text.split()).replace("<", "&lt;")


def _cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell (a pipe escaped: a code host's tables split
    at any other pipe, even one inside backticks)."""
    return _paragraph(text).replace("|", "\\|")


def _code_cell(text: str) -> str:
    """``text`` safe inside a code span of a table cell (a pipe inside backticks does not
    split the cell, and a backslash there would be shown)."""
    return text.replace("`", "'").replace("\n", " ")

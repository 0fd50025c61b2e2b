"""Record shapes: which fields a record has, and checked access to them.

A record's shape is detected from its keys (a key whose value is ``null`` counts as
absent, as Parquet and ``datasets`` fill missing columns with nulls):

    chat                {"messages": [{"role": ..., "content": ...}, ...]}
    prompt_completion   {"prompt": str | messages, "completion": str | messages}
    preference          {"prompt": str | messages, "chosen": str | messages,
                         "rejected": str | messages}
    labeled             {"prompt": str | messages, "completion": str | messages,
                         "label": bool}
    group               {"prompt": str | messages, "completions": [str, ...],
                         "rewards": [float, ...], "logprobs"?: [[float, ...], ...]}
    text                {"text": str}
    prompt              {"prompt": str | messages, <any other columns>}

Each sample kind accepts some shapes (:data:`KIND_SHAPES`); the ``prompt`` kind (online RL)
accepts any record with a ``prompt``: its other columns are data for the reward functions,
whatever their names. Every accessor raises an
:class:`~ardea.errors.ArdeaError` naming the file, line, field and what was expected.
"""

from __future__ import annotations

import math
from typing import Any

from ardea.data.records import Record
from ardea.errors import ArdeaError

SHAPE_FIELDS: dict[str, tuple[str, ...]] = {
    "chat": ("messages",),
    "prompt_completion": ("prompt", "completion"),
    "preference": ("prompt", "chosen", "rejected"),
    "labeled": ("prompt", "completion", "label"),
    "group": ("prompt", "completions", "rewards"),
    "text": ("text",),
    "prompt": ("prompt",),
}

KIND_SHAPES: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "sft": ("chat", "prompt_completion"),
    "preference": ("preference",),
    "labeled": ("labeled", "preference"),
    "group": ("group",),
    "prompt": ("prompt",),
}

Message = dict[str, Any]


def _has(data: dict[str, Any], key: str) -> bool:
    return data.get(key) is not None


def _fields_text(shape: str) -> str:
    return ", ".join(repr(name) for name in SHAPE_FIELDS[shape])


def _got_fields(data: dict[str, Any]) -> str:
    present = [repr(key) for key, value in data.items() if value is not None]
    return ", ".join(present) if present else "none"


def detect_format(record: Record | dict[str, Any]) -> str:
    """The shape of ``record``: ``chat``, ``prompt_completion``, ``preference``,
    ``labeled``, ``group``, ``text`` or ``prompt`` (see module docstring); raises if none of their keys is present."""
    if not isinstance(record, Record):
        record = Record(record)
    data = record.data
    if _has(data, "messages"):
        return "chat"
    if _has(data, "chosen") or _has(data, "rejected"):
        return "preference"
    if _has(data, "completions") or _has(data, "rewards"):
        return "group"
    if _has(data, "label"):
        return "labeled"
    if _has(data, "completion"):
        return "prompt_completion"
    if _has(data, "text"):
        return "text"
    if _has(data, "prompt"):
        return "prompt"
    known = "; ".join(f"{shape}: {_fields_text(shape)}" for shape in SHAPE_FIELDS)
    raise record.error(f"unknown record shape (fields: {_got_fields(data)}); known shapes: {known}")


def check_kind(record: Record, kind: str) -> str:
    """The shape of ``record``, which must be one ``kind`` accepts, else an error naming the
    fields that kind expects."""
    if kind not in KIND_SHAPES:
        raise ArdeaError(f"unknown sample kind {kind!r}; known kinds: {', '.join(KIND_SHAPES)}")
    expected = " or ".join(f"{{{_fields_text(shape)}}}" for shape in KIND_SHAPES[kind])
    if kind == "prompt":  # every other column is data, even one named like another shape's
        shape = "prompt" if _has(record.data, "prompt") else None
    else:
        try:
            shape = detect_format(record)
        except ArdeaError:
            shape = None
    if shape not in KIND_SHAPES[kind]:
        raise record.error(
            f"a {kind!r} sample needs the fields {expected}; this record has fields "
            f"{_got_fields(record.data)}"
        )
    for name in SHAPE_FIELDS[shape]:
        if not _has(record.data, name):
            raise record.error(
                f"missing field {name!r} (a {shape} record needs {_fields_text(shape)})"
            )
    return shape


def _type_name(value: Any) -> str:
    names = {str: "a string", list: "a list", dict: "an object", bool: "a boolean"}
    names.update({int: "an integer", float: "a number", type(None): "null"})
    return names.get(type(value), type(value).__name__)


def expect_str(record: Record, name: str, value: Any) -> str:
    """``value`` (the field ``name``) as a string, else an error."""
    if not isinstance(value, str):
        raise record.error(f"field {name!r} must be a string, got {_type_name(value)}")
    return value


def expect_list(record: Record, name: str, value: Any, *, nonempty: bool = True) -> list[Any]:
    """``value`` as a (non-empty) list, else an error."""
    if not isinstance(value, (list, tuple)):
        raise record.error(f"field {name!r} must be a list, got {_type_name(value)}")
    if nonempty and not value:
        raise record.error(f"field {name!r} is an empty list")
    return list(value)


def expect_messages(record: Record, name: str, value: Any) -> list[Message]:
    """A non-empty list of ``{"role": str, "content": str, ...}`` messages (other keys, such
    as ``tool_calls``, pass through to the chat template unchanged)."""
    messages = expect_list(record, name, value)
    for index, message in enumerate(messages):
        where = f"{name}[{index}]"
        if not isinstance(message, dict):
            raise record.error(
                f"field {where!r} must be a message object with 'role' and 'content', "
                f"got {_type_name(message)}"
            )
        for key in ("role", "content"):
            if message.get(key) is None:
                raise record.error(f"missing field '{where}.{key}'")
            expect_str(record, f"{where}.{key}", message[key])
    return [dict(message) for message in messages]


def expect_text_or_messages(record: Record, name: str, value: Any) -> str | list[Message]:
    """A string, or a list of messages as in conversational TRL datasets."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return expect_messages(record, name, value)
    raise record.error(
        f"field {name!r} must be a string or a list of messages, got {_type_name(value)}"
    )


def expect_number(record: Record, name: str, value: Any) -> float:
    """A finite int/float (not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise record.error(f"field {name!r} must be a number, got {_type_name(value)}")
    if not math.isfinite(value):
        raise record.error(f"field {name!r} must be finite, got {value}")
    return float(value)

"""Reading training data files into records: plain dicts that remember where they came from.

Supported inputs (local disk only):

- ``.jsonl`` — one JSON object per line; blank lines are skipped; ``Record.line`` is the
  1-based line number.
- ``.json`` — one JSON list of objects; ``Record.line`` is the 0-based list index.
- ``.parquet`` — read with ``pyarrow``; ``Record.line`` is the 0-based row index.
- a Hugging Face ``datasets`` directory written by ``save_to_disk``; a ``DatasetDict``
  contributes its ``train`` split. ``Record.line`` is the 0-based row index.

Every problem with a file is an :class:`~ardea.errors.ArdeaError` whose message is one line
naming the file and, where there is one, the line or row: a missing file, an empty file,
a line that is not UTF-8 or not JSON, a record that is not an object, an unknown format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ardea.errors import ArdeaError

SUPPORTED_FORMATS = (
    ".jsonl (one JSON object per line)",
    ".json (a list of objects)",
    ".parquet",
    "a Hugging Face datasets directory (save_to_disk)",
)


@dataclass(frozen=True)
class Record:
    """One training record.

    Attributes:
        data: the record's fields.
        source: the file (or directory) it was read from.
        line: 1-based line for JSONL, 0-based index for JSON lists, Parquet rows and
            ``datasets`` rows; ``None`` for records built in memory.
        unit: what ``line`` counts: ``"line"``, ``"item"`` or ``"row"``.
    """

    data: dict[str, Any]
    source: str = "<memory>"
    line: int | None = None
    unit: str = "line"

    @property
    def where(self) -> str:
        """``"data.jsonl line 3"``: the place to name in an error message."""
        return self.source if self.line is None else f"{self.source} {self.unit} {self.line}"

    def error(self, message: str) -> ArdeaError:
        """An :class:`ArdeaError` ``"<where>: <message>"`` (one line)."""
        return ArdeaError(f"{self.where}: {message}")


def _one_line(text: str, limit: int = 120) -> str:
    """``text`` on one line, shortened to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _as_record(value: Any, source: str, line: int, unit: str) -> Record:
    if not isinstance(value, dict):
        raise ArdeaError(
            f"{source} {unit} {line} is not a JSON object (got {type(value).__name__}); "
            'each record must be an object such as {"prompt": ..., "completion": ...}'
        )
    return Record(value, source, line, unit)


def _decode_line(raw: bytes, source: str, number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ArdeaError(
            f"{source} line {number} is not valid UTF-8 (byte 0x{raw[err.start]:02x} at "
            f"column {err.start + 1}); re-encode the file as UTF-8"
        ) from None


def _read_jsonl(path: Path) -> list[Record]:
    source = str(path)
    records = []
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        text = _decode_line(raw, source, number)
        if number == 1:
            text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise ArdeaError(
                f"{source} line {number} is not valid JSON: {err.msg} (column {err.colno})"
            ) from None
        records.append(_as_record(value, source, number, "line"))
    return records


def _read_json(path: Path) -> list[Record]:
    source = str(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ArdeaError(
            f"{source} line {line} is not valid UTF-8 (byte 0x{raw[err.start]:02x}); "
            "re-encode the file as UTF-8"
        ) from None
    if not text.strip():
        return []
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ArdeaError(
            f"{source} line {err.lineno} is not valid JSON: {err.msg} (column {err.colno})"
        ) from None
    if not isinstance(value, list):
        raise ArdeaError(
            f"{source} must hold a JSON list of objects, got a {type(value).__name__}; "
            "use .jsonl for one object per line"
        )
    return [_as_record(item, source, index, "item") for index, item in enumerate(value)]


def _read_parquet(path: Path) -> list[Record]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as err:
        raise ArdeaError(f"{path} is not a readable Parquet file: {_one_line(err)}") from None
    return [Record(row, str(path), index, "row") for index, row in enumerate(rows)]


def _is_datasets_dir(path: Path) -> bool:
    return any((path / name).is_file() for name in ("dataset_dict.json", "state.json"))


def _read_datasets_dir(path: Path) -> list[Record]:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as err:  # datasets raises many types for a damaged directory
        raise ArdeaError(
            f"{path} is not a readable Hugging Face datasets directory: {_one_line(err)}"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise ArdeaError(
                f"{path} is a DatasetDict without a 'train' split (splits: "
                f"{', '.join(loaded)}); point data.path at one split's directory"
            )
        loaded = loaded["train"]
    return [Record(dict(row), str(path), index, "row") for index, row in enumerate(loaded)]


def read_records(path: str | Path) -> list[Record]:
    """Read every record of a data file or ``datasets`` directory (see module docstring).

    Raises:
        ArdeaError: the path does not exist, has an unknown format, holds no records, or
            one of its lines/items is not UTF-8, not JSON or not an object.
    """
    path = Path(path)
    if not path.exists():
        raise ArdeaError(f"data file {path} does not exist")
    if path.is_dir():
        if not _is_datasets_dir(path):
            raise ArdeaError(
                f"{path} is a directory but not a Hugging Face datasets directory (no "
                f"state.json or dataset_dict.json); supported: {'; '.join(SUPPORTED_FORMATS)}"
            )
        records = _read_datasets_dir(path)
    elif path.suffix == ".jsonl":
        records = _read_jsonl(path)
    elif path.suffix == ".json":
        records = _read_json(path)
    elif path.suffix == ".parquet":
        records = _read_parquet(path)
    else:
        raise ArdeaError(
            f"{path}: unknown data format {path.suffix or '(no extension)'!r}; "
            f"supported: {'; '.join(SUPPORTED_FORMATS)}"
        )
    if not records:
        raise ArdeaError(f"{path} holds no records")
    return records

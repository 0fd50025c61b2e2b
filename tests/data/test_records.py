"""Record readers: JSONL, JSON, Parquet and datasets directories, and their one-line errors."""

import json

import pytest

from ardea.data import Record, read_records
from ardea.errors import ArdeaError

ROWS = [{"prompt": "1+1=", "completion": "2"}, {"prompt": "2+2=", "completion": "4"}]


def one_line_error(path, match):
    with pytest.raises(ArdeaError, match=match) as info:
        read_records(path)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_jsonl_lines_are_numbered_from_one_and_blank_lines_skipped(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\ufeff" + json.dumps(ROWS[0]) + "\n\n  \n" + json.dumps(ROWS[1]) + "\r\n")
    records = read_records(path)
    assert [r.data for r in records] == ROWS
    assert [r.line for r in records] == [1, 4]
    assert all(r.source == str(path) for r in records)
    assert records[1].where == f"{path} line 4"


def test_json_list(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(ROWS, indent=2))
    records = read_records(path)
    assert [r.data for r in records] == ROWS
    assert [r.where for r in records] == [f"{path} item 0", f"{path} item 1"]


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    chat = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    ]
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    records = read_records(path)
    assert [r.data for r in records] == ROWS and [r.line for r in records] == [0, 1]
    assert records[1].where == f"{path} row 1"
    pq.write_table(pa.Table.from_pylist(chat), path)
    assert read_records(path)[0].data == chat[0]


def test_datasets_directory_and_dataset_dict(tmp_path):
    import datasets

    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "plain"))
    records = read_records(tmp_path / "plain")
    assert [r.data for r in records] == ROWS and [r.line for r in records] == [0, 1]

    splits = datasets.DatasetDict(
        train=datasets.Dataset.from_list(ROWS[:1]), test=datasets.Dataset.from_list(ROWS[1:])
    )
    splits.save_to_disk(str(tmp_path / "dict"))
    assert [r.data for r in read_records(tmp_path / "dict")] == ROWS[:1]

    datasets.DatasetDict(dev=datasets.Dataset.from_list(ROWS)).save_to_disk(str(tmp_path / "nt"))
    one_line_error(tmp_path / "nt", r"without a 'train' split \(splits: dev\)")


def test_missing_file(tmp_path):
    one_line_error(tmp_path / "nope.jsonl", r"data file .*nope.jsonl does not exist")


@pytest.mark.parametrize("name, content", [("e.jsonl", ""), ("b.jsonl", "\n \n"), ("e.json", "[]")])
def test_empty_files_hold_no_records(tmp_path, name, content):
    (tmp_path / name).write_text(content)
    one_line_error(tmp_path / name, rf"{name} holds no records$")


def test_non_utf8_line_is_named(tmp_path):
    path = tmp_path / "d.jsonl"
    lines = [json.dumps(r).encode() for r in ROWS * 3]
    lines[6 - 1] = b'{"prompt": "caf\xe9", "completion": "x"}'  # Latin-1 on line 6
    path.write_bytes(b"\n".join(lines) + b"\n")
    message = one_line_error(path, r"d.jsonl line 6 is not valid UTF-8 \(byte 0xe9 at column 16\)")
    assert message.startswith(str(path))
    (tmp_path / "d.json").write_bytes(b'[\n{"text": "a"},\n{"text": "\xff"}\n]')
    one_line_error(tmp_path / "d.json", r"d.json line 3 is not valid UTF-8")


def test_invalid_json_line_is_named(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + '\n{"prompt": "3+3=",\n')
    one_line_error(path, r"d.jsonl line 3 is not valid JSON: .*\(column \d+\)")
    (tmp_path / "d.json").write_text('[\n{"text": "a"},\n{"text": }\n]')
    one_line_error(tmp_path / "d.json", r"d.json line 3 is not valid JSON")


def test_records_must_be_objects(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n[1, 2]\n')
    one_line_error(tmp_path / "d.jsonl", r"d.jsonl line 2 is not a JSON object \(got list\)")
    (tmp_path / "d.json").write_text('[{"text": "a"}, "b"]')
    one_line_error(tmp_path / "d.json", r"d.json item 1 is not a JSON object \(got str\)")
    (tmp_path / "o.json").write_text('{"text": "a"}')
    one_line_error(tmp_path / "o.json", r"must hold a JSON list of objects, got a dict")


def test_unknown_formats_list_the_supported_ones(tmp_path):
    (tmp_path / "d.csv").write_text("a,b\n")
    one_line_error(tmp_path / "d.csv", r"unknown data format '.csv'; supported: .jsonl.*\.parquet")
    (tmp_path / "dir").mkdir()
    one_line_error(tmp_path / "dir", r"not a Hugging Face datasets directory")
    (tmp_path / "bad.parquet").write_text("not parquet")
    one_line_error(tmp_path / "bad.parquet", r"bad.parquet is not a readable Parquet file")


def test_record_defaults_and_error():
    record = Record({"text": "x"})
    assert record.where == "<memory>" and record.line is None
    assert str(Record({}, "f.jsonl", 3).error("boom")) == "f.jsonl line 3: boom"

"""load_samples end to end: shapes, the shipped examples, and one clear line per bad dataset."""

import json
from pathlib import Path

import pytest

from ardea.data import (
    GroupSample,
    PreferenceSample,
    PromptSample,
    Record,
    SFTSample,
    detect_format,
    load_samples,
    read_records,
    tokenize_records,
)
from ardea.errors import ArdeaError

from .conftest import EOS, IM_END, b

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def load_error(path, tokenizer, kind, match, **kwargs):
    kwargs.setdefault("max_length", 256)
    with pytest.raises(ArdeaError, match=match) as info:
        load_samples(path, tokenizer, kind, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path))
    return message


@pytest.mark.parametrize(
    "data, shape",
    [
        ({"messages": []}, "chat"),
        ({"prompt": "a", "completion": "b"}, "prompt_completion"),
        ({"prompt": "a", "chosen": "b", "rejected": "c"}, "preference"),
        ({"prompt": "a", "completions": ["b"], "rewards": [1.0]}, "group"),
        ({"text": "a", "id": 3}, "text"),
        ({"text": "a", "messages": None, "completion": None}, "text"),  # nulls count as absent
    ],
)
def test_detect_format(data, shape):
    assert detect_format(data) == shape
    assert detect_format(Record(data, "x.jsonl", 1)) == shape


def test_detect_format_names_the_known_shapes():
    with pytest.raises(
        ArdeaError,
        match=r"^x.jsonl line 4: unknown record shape \(fields: 'foo'\); known shapes: chat: 'messages'; prompt_completion",
    ):
        detect_format(Record({"foo": 1}, "x.jsonl", 4))


@pytest.mark.parametrize(
    "name, kind, sample_type, count",
    [
        ("chat.jsonl", "sft", SFTSample, 200),
        ("text.jsonl", "text", SFTSample, 200),
        ("preference.jsonl", "preference", PreferenceSample, 300),
        ("groups.jsonl", "group", GroupSample, 200),
        ("prompts.jsonl", "prompt", PromptSample, 200),
    ],
)
def test_shipped_examples_load(tokenizer, name, kind, sample_type, count):
    path = EXAMPLES / name
    assert path.stat().st_size <= 100_000
    samples = load_samples(path, tokenizer, kind, max_length=256)
    assert len(samples) == count and all(isinstance(s, sample_type) for s in samples)
    if kind == "sft":
        trained = [t for s in samples for t, m in zip(s.input_ids, s.loss_mask) if m]
        assert trained.count(IM_END) == sum(
            m["role"] == "assistant" for r in read_records(path) for m in r.data["messages"]
        )
    if kind == "group":
        assert all(len(s.completions) == 4 and set(s.rewards) <= {0.0, 1.0} for s in samples)
    if kind == "prompt":  # an addition, its answer and its operands, all kept for the rewards
        for s in samples:
            a, c = s.row["operands"]
            assert s.prompt == f"{a}+{c}=" and s.row["answer"] == str(a + c)


def test_prompt_completion_file(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "pc.jsonl", [{"prompt": "1+1=", "completion": "2"}])
    assert load_samples(path, tokenizer, "sft", max_length=8) == [
        SFTSample([*b("1+1=2"), EOS], [0, 0, 0, 0, 1, 1])
    ]


def test_bad_datasets_get_one_clear_line_each(tokenizer, tmp_path):
    good = {"prompt": "1+1=", "completion": "2"}
    # missing field
    path = write_jsonl(tmp_path / "missing.jsonl", [good, good, {"prompt": "3+3=", "chosen": "6"}])
    load_error(path, tokenizer, "preference", r"missing.jsonl line 1: a 'preference' sample needs")
    load_error(
        path,
        tokenizer,
        "sft",
        r"line 3: a 'sft' sample needs the fields .* this record has fields 'prompt', 'chosen'",
    )
    path = write_jsonl(tmp_path / "m2.jsonl", [good, {"prompt": "3+3=", "chosen": "6"}])
    path.write_text(path.read_text().replace(json.dumps(good) + "\n", "", 1))
    load_error(path, tokenizer, "preference", r"m2.jsonl line 1: missing field 'rejected'")
    # empty file
    (tmp_path / "empty.jsonl").write_text("")
    load_error(tmp_path / "empty.jsonl", tokenizer, "sft", r"empty.jsonl holds no records$")
    # non-UTF-8 line
    (tmp_path / "latin1.jsonl").write_bytes(
        (json.dumps(good) + "\n").encode() * 6
        + '{"prompt": "né", "completion": "x"}\n'.encode("latin-1")
    )
    load_error(
        tmp_path / "latin1.jsonl", tokenizer, "sft", r"latin1.jsonl line 7 is not valid UTF-8"
    )
    # prompt longer than the context
    path = write_jsonl(tmp_path / "long.jsonl", [good, {"prompt": "9" * 40, "completion": "1"}])
    load_error(
        path,
        tokenizer,
        "sft",
        r"long.jsonl line 2: the prompt alone is 40 tokens, more than max_length=32",
        max_length=32,
    )
    # a file with nothing usable
    path = write_jsonl(tmp_path / "blank.jsonl", [{"text": ""}, {"text": ""}])
    load_error(path, tokenizer, "text", r"blank.jsonl holds no usable records for 'text' samples")


def test_unknown_kind_and_bad_max_length(tokenizer):
    records = [Record({"text": "a"})]
    with pytest.raises(
        ArdeaError,
        match="unknown sample kind 'dpo'; known kinds: text, sft, preference, labeled, group",
    ):
        tokenize_records(records, tokenizer, "dpo", max_length=8)
    with pytest.raises(ArdeaError, match="max_length must be >= 1, got 0"):
        tokenize_records(records, tokenizer, "text", max_length=0)


def test_parquet_and_datasets_dir_load_as_jsonl(tokenizer, tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (EXAMPLES / "chat.jsonl").read_text().splitlines()[:20]]
    expected = load_samples(
        write_jsonl(tmp_path / "c.jsonl", rows), tokenizer, "sft", max_length=256
    )
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "c_ds"))
    assert load_samples(tmp_path / "c.parquet", tokenizer, "sft", max_length=256) == expected
    assert load_samples(tmp_path / "c_ds", tokenizer, "sft", max_length=256) == expected

"""Prompt records for online RL: token ids spelled out by hand, every other column kept for
the reward functions, and one clear line per bad record."""

import json

import pytest

from ardea.data import (
    Example,
    PromptSample,
    Record,
    detect_format,
    load_samples,
    reward_row,
    rollout_prompt_ids,
    tokenize_records,
)
from ardea.errors import ArdeaError

from .conftest import IM_END, IM_START, b


def prompts(tokenizer, *data, max_length=64, chat_template=False):
    records = [Record(d, "p.jsonl", i + 1) for i, d in enumerate(data)]
    return tokenize_records(
        records, tokenizer, "prompt", max_length=max_length, chat_template=chat_template
    )


def user_turn(content):
    """ChatML ids of one user message followed by the assistant's generation prompt."""
    return [IM_START, *b("user\n" + content), IM_END, *b("\n"), IM_START, *b("assistant\n")]


def test_a_string_prompt_is_raw_text_and_every_column_is_kept(tokenizer):
    record = {"prompt": "12+34=", "answer": "46", "id": 7, "meta": {"level": 2}, "note": None}
    [sample] = prompts(tokenizer, record)
    assert sample == PromptSample(tuple(b("12+34=")), record)
    assert sample.prompt == "12+34="
    assert detect_format(record) == "prompt"


def test_columns_named_like_other_shapes_are_data_for_a_prompt_sample(tokenizer):
    record = {"prompt": "1+1=", "completion": "2", "text": "x", "rewards": [1]}
    [sample] = prompts(tokenizer, record)
    assert sample.prompt_ids == tuple(b("1+1=")) and sample.row == record


def test_chat_prompts_use_the_template_with_the_generation_prompt(tokenizer):
    [as_user] = prompts(tokenizer, {"prompt": "2+2?"}, chat_template=True)
    assert list(as_user.prompt_ids) == user_turn("2+2?")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    [conversation] = prompts(tokenizer, {"prompt": messages, "answer": "4"})
    system = [IM_START, *b("system\nBe brief."), IM_END, *b("\n")]
    assert list(conversation.prompt_ids) == system + user_turn("2+2?")
    assert conversation.prompt == messages and conversation.row["answer"] == "4"


def test_reward_rows_of_records_and_of_task_examples(tokenizer):
    [sample] = prompts(tokenizer, {"prompt": "3+4=", "answer": "7", "tags": ["a"]})
    row = reward_row(sample)
    assert row == {"prompt": "3+4=", "answer": "7", "tags": ["a"]}
    row["answer"] = "changed"  # a reward function that writes to its row
    assert reward_row(sample)["answer"] == "7"
    example = Example("3+4=", "7", {"a": 3})
    assert reward_row(example) == {"prompt": "3+4=", "answer": "7", "meta": {"a": 3}}


def test_rollout_prompt_ids_of_records_and_of_task_examples(tokenizer):
    [sample] = prompts(tokenizer, {"prompt": [{"role": "user", "content": "5+5="}]})
    assert rollout_prompt_ids(tokenizer, sample, chat_template=False) == user_turn("5+5=")
    example = Example("5+5=", "10")
    assert rollout_prompt_ids(tokenizer, example, chat_template=False) == b("5+5=")
    assert rollout_prompt_ids(tokenizer, example, chat_template=True) == user_turn("5+5=")


@pytest.mark.parametrize(
    "record, message",
    [
        (
            {"question": "1+1=", "answer": "2"},
            r"^p.jsonl line 2: a 'prompt' sample needs the fields \{'prompt'\}; this record "
            r"has fields 'question', 'answer'$",
        ),
        ({"prompt": None, "answer": "2"}, r"line 2: a 'prompt' sample needs the fields"),
        (
            {"prompt": 12},
            r"^p.jsonl line 2: field 'prompt' must be a string or a list of messages, got an "
            r"integer$",
        ),
        ({"prompt": ""}, r"^p.jsonl line 2: field 'prompt' encodes to no tokens"),
        ({"prompt": [{"role": "user"}]}, r"^p.jsonl line 2: missing field 'prompt\[0\].content'$"),
        (
            {"prompt": "9" * 40},
            r"^p.jsonl line 2: the prompt is 40 tokens, more than max_length=32 \(the longest "
            r"prompt that leaves room for rollout.max_new_tokens\)",
        ),
    ],
)
def test_bad_prompt_records_get_one_clear_line(tokenizer, record, message):
    with pytest.raises(ArdeaError, match=message) as info:
        prompts(tokenizer, {"prompt": "1+1="}, record, max_length=32)
    assert "\n" not in str(info.value)


def test_jsonl_parquet_and_datasets_dir_give_the_same_prompts(tokenizer, tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a), "level": a % 3} for a in range(12)]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    expected = [PromptSample(tuple(b(r["prompt"])), r) for r in rows]
    assert load_samples(path, tokenizer, "prompt", max_length=16) == expected
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "p_ds"))
    assert load_samples(tmp_path / "p.parquet", tokenizer, "prompt", max_length=16) == expected
    assert load_samples(tmp_path / "p_ds", tokenizer, "prompt", max_length=16) == expected

"""Text samples: every token trained, eos appended, long texts cut into chunks."""

import pytest

from ardea.data import Record, SFTSample, collate_sft, tokenize_records
from ardea.errors import ArdeaError

from .conftest import EOS, b


def text_samples(tokenizer, *texts, max_length=256):
    records = [Record({"text": t}, "t.jsonl", i + 1) for i, t in enumerate(texts)]
    return tokenize_records(records, tokenizer, "text", max_length=max_length)


def test_text_is_trained_on_every_token_with_eos(tokenizer):
    [sample] = text_samples(tokenizer, "Hi there.")
    assert sample == SFTSample([*b("Hi there."), EOS], [1] * 10)


def test_long_text_is_chunked_and_one_token_tails_dropped(tokenizer):
    ids = [*b("abcdefghij"), EOS]  # 11 tokens
    assert text_samples(tokenizer, "abcdefghij", max_length=4) == [
        SFTSample(ids[0:4], [1] * 4),
        SFTSample(ids[4:8], [1] * 4),
        SFTSample(ids[8:11], [1] * 3),
    ]
    # 11 tokens in chunks of 5: the last chunk would be eos alone, nothing to predict in it
    assert [s.input_ids for s in text_samples(tokenizer, "abcdefghij", max_length=5)] == [
        ids[0:5],
        ids[5:10],
    ]


def test_empty_texts_are_skipped_and_wrong_types_rejected(tokenizer):
    assert text_samples(tokenizer, "", "a") == [SFTSample([*b("a"), EOS], [1, 1])]
    with pytest.raises(
        ArdeaError, match=r"^t.jsonl line 1: field 'text' must be a string, got a list$"
    ):
        tokenize_records([Record({"text": ["a"]}, "t.jsonl", 1)], tokenizer, "text", max_length=8)
    with pytest.raises(
        ArdeaError,
        match=r"a 'text' sample needs the fields \{'text'\}; this record has fields 'prompt', 'completion'",
    ):
        tokenize_records(
            [Record({"prompt": "a", "completion": "b"}, "t.jsonl", 1)],
            tokenizer,
            "text",
            max_length=8,
        )


def test_text_samples_collate_like_sft(tokenizer):
    batch = collate_sft(text_samples(tokenizer, "ab", "abcd"), pad_token_id=0)
    assert batch.input_ids.tolist() == [[*b("ab"), EOS, 0, 0], [*b("abcd"), EOS]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 0, 0], [1] * 5]
    assert batch.loss_mask.int().tolist() == [[1, 1, 1, 0, 0], [1] * 5]

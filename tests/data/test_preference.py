"""Preference samples: prompt/chosen/rejected ids and the DPO batch layout."""

import pytest

from ardea.data import (
    PreferenceSample,
    Record,
    collate_preference,
    preference_pairs,
    tokenize_records,
)
from ardea.errors import ArdeaError

from .conftest import EOS, IM_END, IM_START, PAD, b


def pref(tokenizer, data, **kwargs):
    kwargs.setdefault("max_length", 256)
    [sample] = tokenize_records([Record(data, "p.jsonl", 2)], tokenizer, "preference", **kwargs)
    return sample


def test_raw_text_responses_end_with_eos(tokenizer):
    sample = pref(tokenizer, {"prompt": "2+2=", "chosen": "4", "rejected": "5"})
    assert sample == PreferenceSample(tuple(b("2+2=")), (*b("4"), EOS), (*b("5"), EOS))


def test_chat_responses_end_with_the_end_of_turn_marker(tokenizer):
    prompt_ids = (IM_START, *b("user\n2+2="), IM_END, *b("\n"), IM_START, *b("assistant\n"))
    want = PreferenceSample(prompt_ids, (*b("4"), IM_END), (*b("15"), IM_END))
    data = {"prompt": "2+2=", "chosen": "4", "rejected": "15"}
    assert pref(tokenizer, data, chat_template=True) == want
    conversational = {
        "prompt": [{"role": "user", "content": "2+2="}],
        "chosen": [{"role": "assistant", "content": "4"}],
        "rejected": [{"role": "assistant", "content": "15"}],
    }
    assert pref(tokenizer, conversational) == want


def test_preference_errors(tokenizer):
    cases = [
        ({"prompt": "a", "chosen": "b"}, r"missing field 'rejected' \(a preference record needs"),
        ({"prompt": "a", "chosen": "b", "rejected": 1}, r"'rejected' must be a string or a list"),
        (
            {"prompt": "a", "chosen": "b", "rejected": [{"role": "user", "content": "c"}]},
            r"'rejected' must be a string or a list of ONE assistant message",
        ),
        ({"messages": []}, r"a 'preference' sample needs the fields \{'prompt', 'chosen', 'rej"),
    ]
    for data, match in cases:
        with pytest.raises(ArdeaError, match=r"^p.jsonl line 2: .*" + match):
            pref(tokenizer, data)
    with pytest.raises(
        ArdeaError, match=r"prompt \+ completion is 7 tokens, more than max_length=6"
    ):
        pref(tokenizer, {"prompt": "abc", "chosen": "d", "rejected": "efg"}, max_length=6)


def test_collate_gives_chosen_rows_then_rejected_rows():
    samples = [
        PreferenceSample((11, 12), (21, EOS), (31, 32, 33, EOS)),
        PreferenceSample((13,), (22, 23, EOS), (34, EOS)),
    ]
    batch = collate_preference(samples, pad_token_id=PAD)
    assert batch.input_ids.tolist() == [
        [11, 12, 21, EOS, 0, 0],  # chosen of pair 0
        [13, 22, 23, EOS, 0, 0],  # chosen of pair 1
        [11, 12, 31, 32, 33, EOS],  # rejected of pair 0
        [13, 34, EOS, 0, 0, 0],  # rejected of pair 1
    ]
    assert batch.attention_mask.tolist() == [
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1] * 6,
        [1, 1, 1, 0, 0, 0],
    ]
    assert batch.loss_mask.int().tolist() == [
        [0, 0, 1, 1, 0, 0],
        [0, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1],
        [0, 1, 1, 0, 0, 0],
    ]
    assert batch.group_ids.tolist() == [0, 1, 0, 1]  # a pair is one group
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0, 0.0]
    chosen, rejected = preference_pairs(batch)
    assert chosen.tolist() == [0, 1] and rejected.tolist() == [2, 3]

"""Group samples: G completions per prompt with rewards and behaviour log-probs."""

import math

import pytest
import torch

from ardea.data import GroupSample, Record, collate_groups, tokenize_records
from ardea.errors import ArdeaError

from .conftest import EOS, IM_END, IM_START, PAD, b


def group(tokenizer, data, **kwargs):
    kwargs.setdefault("max_length", 256)
    [sample] = tokenize_records([Record(data, "g.jsonl", 5)], tokenizer, "group", **kwargs)
    return sample


def test_completions_end_with_eos_and_keep_their_logprobs(tokenizer):
    data = {
        "prompt": "1+2=",
        "completions": ["3", "12"],
        "rewards": [1, 0.0],
        "logprobs": [[-0.1, -0.2], [-1.0, -2.0, -3.0]],
    }
    assert group(tokenizer, data) == GroupSample(
        prompt_ids=tuple(b("1+2=")),
        completions=((*b("3"), EOS), (*b("12"), EOS)),
        rewards=(1.0, 0.0),
        logprobs=((-0.1, -0.2), (-1.0, -2.0, -3.0)),
    )


def test_chat_group(tokenizer):
    sample = group(
        tokenizer, {"prompt": "q", "completions": ["a"], "rewards": [0.5]}, chat_template=True
    )
    assert sample.prompt_ids == (
        IM_START,
        *b("user\nq"),
        IM_END,
        *b("\n"),
        IM_START,
        *b("assistant\n"),
    )
    assert sample.completions == ((*b("a"), IM_END),) and sample.logprobs is None


def test_group_errors(tokenizer):
    base = {"prompt": "1+2=", "completions": ["3", "12"], "rewards": [1.0, 0.0]}
    cases = [
        ({**base, "rewards": [1.0]}, r"field 'rewards' has 1 values but 'completions' has 2"),
        ({**base, "rewards": [1.0, "x"]}, r"field 'rewards\[1\]' must be a number, got a string"),
        ({**base, "rewards": [1.0, math.nan]}, r"field 'rewards\[1\]' must be finite"),
        ({**base, "completions": ["3", 4]}, r"field 'completions\[1\]' must be a string"),
        ({**base, "completions": []}, r"field 'completions' is an empty list"),
        ({**base, "logprobs": [[-1.0, -1.0]]}, r"'logprobs' has 1 lists but there are 2 comp"),
        (
            {**base, "logprobs": [[-1.0, -1.0], [-1.0, -1.0]]},
            r"field 'logprobs\[1\]' has 2 values but completion 1 has 3 tokens",
        ),
        (
            {**base, "logprobs": [[-1.0, 0.5], [-1, -1, -1]]},
            r"'logprobs\[0\]\[1\]' = 0.5 is positive",
        ),
        ({"prompt": "1+2=", "completions": ["3"]}, r"missing field 'rewards'"),
    ]
    for data, match in cases:
        with pytest.raises(ArdeaError, match=r"^g.jsonl line 5: .*" + match) as info:
            group(tokenizer, data)
        assert "\n" not in str(info.value)


def test_collate_groups_rows_by_sample_then_completion():
    samples = [
        GroupSample(
            (11, 12), ((21, EOS), (22, 23, EOS)), (1.0, 0.0), ((-1.0, -2.0), (-3.0, -4.0, -5.0))
        ),
        GroupSample((13,), ((24, EOS),), (0.5,), ((-6.0, -7.0),)),
    ]
    batch = collate_groups(samples, pad_token_id=PAD)
    assert batch.input_ids.shape == (3, 5) and batch.logprobs.dtype == torch.float32
    assert batch.input_ids.tolist() == [
        [11, 12, 21, EOS, 0],
        [11, 12, 22, 23, EOS],
        [13, 24, EOS, 0, 0],
    ]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 0], [1] * 5, [1, 1, 1, 0, 0]]
    assert batch.loss_mask.int().tolist() == [[0, 0, 1, 1, 0], [0, 0, 1, 1, 1], [0, 1, 1, 0, 0]]
    assert batch.logprobs.tolist() == [[0, 0, -1, -2, 0], [0, 0, -3, -4, -5], [0, -6, -7, 0, 0]]
    assert batch.rewards.tolist() == [1.0, 0.0, 0.5]
    assert batch.group_ids.tolist() == [0, 0, 1]
    assert batch.turn_ids.tolist() == [[-1, -1, 0, 0, -1], [-1, -1, 0, 0, 0], [-1, 0, 0, -1, -1]]
    assert batch.versions.unique().tolist() == [-1]  # offline data has no policy version


def test_collate_groups_drops_logprobs_unless_every_sample_has_them():
    samples = [
        GroupSample((11,), ((21, EOS),), (1.0,), ((-1.0, -2.0),)),
        GroupSample((13,), ((24, EOS),), (0.0,), None),
    ]
    assert collate_groups(samples, pad_token_id=PAD).logprobs is None

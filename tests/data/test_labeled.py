"""KTO's labeled samples: records and pairs → samples, and the batch of labeled rows
followed by their mismatched rows."""

import pytest
import torch

from ardea.data import (
    LabeledSample,
    Record,
    collate_labeled,
    labeled_rows,
    make_task,
    task_labeled_samples,
    tokenize_records,
)
from ardea.errors import ArdeaError

from .conftest import EOS, PAD, b


def labeled(tokenizer, *data, **kwargs):
    kwargs.setdefault("max_length", 256)
    records = [Record(d, "k.jsonl", i + 1) for i, d in enumerate(data)]
    return tokenize_records(records, tokenizer, "labeled", **kwargs)


def test_records_and_pairs_become_samples(tokenizer):
    got = labeled(
        tokenizer,
        {"prompt": "2+2=", "completion": "4", "label": True},
        {"prompt": "2+2=", "completion": "5", "label": False},
        {"prompt": "1+1=", "chosen": "2", "rejected": "3"},  # a pair gives both halves
    )
    assert got == [
        LabeledSample(tuple(b("2+2=")), (*b("4"), EOS), True),
        LabeledSample(tuple(b("2+2=")), (*b("5"), EOS), False),
        LabeledSample(tuple(b("1+1=")), (*b("2"), EOS), True),
        LabeledSample(tuple(b("1+1=")), (*b("3"), EOS), False),
    ]


def test_bad_labels_and_lengths_are_named(tokenizer):
    with pytest.raises(ArdeaError, match=r"k.jsonl.*line 1.*'label' must be true .* got 1"):
        labeled(tokenizer, {"prompt": "2+2=", "completion": "4", "label": 1})
    with pytest.raises(ArdeaError, match=r"'labeled' sample needs the fields"):
        labeled(tokenizer, {"prompt": "2+2=", "completion": "4"})
    with pytest.raises(ArdeaError, match="k.jsonl"):
        labeled(tokenizer, {"prompt": "2+2=", "completion": "44444", "label": True}, max_length=6)


def test_sft_refuses_labeled_records(tokenizer):
    record = Record({"prompt": "2+2=", "completion": "5", "label": False}, "k.jsonl", 1)
    with pytest.raises(ArdeaError, match="'sft' sample needs"):
        tokenize_records([record], tokenizer, "sft", max_length=64)


def test_batch_holds_the_rows_then_their_mismatched_rows():
    samples = [
        LabeledSample((10, 11), (20, 21, 22), True),
        LabeledSample((12,), (30,), False),
        LabeledSample((13, 14, 15), (40, 41), True),
    ]
    batch = collate_labeled(samples, PAD)
    rows, mismatched, desirable = labeled_rows(batch)
    assert rows.tolist() == [0, 1, 2] and mismatched.tolist() == [3, 4, 5]
    assert desirable.tolist() == [True, False, True]

    def row(i):
        return batch.input_ids[i][batch.attention_mask[i].bool()].tolist()

    def trained(i):
        return batch.input_ids[i][batch.loss_mask[i]].tolist()

    assert [row(i) for i in range(3)] == [[10, 11, 20, 21, 22], [12, 30], [13, 14, 15, 40, 41]]
    # prompt i with completion i - 1 (cyclically), cut to the longest real row (5 tokens)
    assert [row(i) for i in range(3, 6)] == [[10, 11, 40, 41], [12, 20, 21, 22], [13, 14, 15, 30]]
    assert trained(3) == [40, 41] and trained(4) == [20, 21, 22]
    long_completion = [
        LabeledSample((1, 2, 3, 4), (5,), True),
        LabeledSample((6,), (7, 8, 9, 10), False),
    ]
    cut = collate_labeled(long_completion, PAD)
    assert cut.input_ids[2][cut.attention_mask[2].bool()].tolist() == [1, 2, 3, 4, 7]


def test_layout_is_checked():
    batch = collate_labeled([LabeledSample((1,), (2,), True)] * 2, PAD)
    with pytest.raises(ValueError, match="a KTO batch holds B labeled rows"):
        labeled_rows(batch.select(torch.tensor([0, 1, 2])))


def test_task_pairs_unpaired_and_shuffled(tokenizer):
    task = make_task("arithmetic", seed=0, digits=2, ops="+")
    samples = task_labeled_samples(task, "train", 8, tokenizer, max_length=64, chat_template=False)
    again = task_labeled_samples(task, "train", 8, tokenizer, max_length=64, chat_template=False)
    assert samples == again and len(samples) == 16
    assert sum(s.desirable for s in samples) == 8
    assert [s.desirable for s in samples] != [True, False] * 8  # not in pair order

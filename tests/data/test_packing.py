"""Packing: first-fit rows, restarting position ids, and documents kept apart by the model."""

import pytest
import torch

from ardea.data import PackedSample, SFTSample, collate_packed, collate_sft, pack_samples
from ardea.model import build_tiny_model, sequence_logprobs

from .conftest import PAD


def documents(lengths, seed=0):
    """SFT documents with random ids: even ones prompt(2) + answer, odd ones all trained."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for index, n in enumerate(lengths):
        ids = torch.randint(6, 262, (n,), generator=generator).tolist()
        mask = [1] * n if index % 2 else [0, 0] + [1] * (n - 2)
        out.append(SFTSample(ids, mask))
    return out


def segments(row):
    """``(start, end)`` of each document of a packed row, found from its position ids."""
    starts = [t for t, p in enumerate(row.position_ids) if p == 0] + [len(row.input_ids)]
    return list(zip(starts[:-1], starts[1:]))


def test_first_fit_in_order_with_restarting_positions():
    docs = documents([5, 4, 3, 6, 2])
    rows = pack_samples(docs, max_length=8)
    expected = [[0, 2], [1, 4], [3]]  # 5+3 | 4+2 | 6
    assert len(rows) == 3
    for row, members in zip(rows, expected):
        assert list(row.input_ids) == [i for m in members for i in docs[m].input_ids]
        assert list(row.position_ids) == [p for m in members for p in range(len(docs[m].input_ids))]
        # each document's first token is not scored (the position before it is another doc)
        assert list(row.loss_mask) == [v for m in members for v in [0, *docs[m].loss_mask[1:]]]
        assert len(row.input_ids) <= 8
    assert pack_samples(docs, max_length=8) == rows  # deterministic


def test_pack_rejects_samples_that_do_not_fit():
    with pytest.raises(ValueError, match="sample 1 has 9 tokens; packing needs 1..8"):
        pack_samples(documents([3, 9]), max_length=8)


def test_collate_packed_pads_with_restarting_positions():
    rows = [
        PackedSample((7, 8, 9, 10, 11), (0, 1, 0, 1, 1), (0, 1, 0, 1, 2)),
        PackedSample((12, 13), (0, 1), (0, 1)),
    ]
    batch = collate_packed(rows, pad_token_id=PAD)
    assert batch.input_ids.tolist() == [[7, 8, 9, 10, 11], [12, 13, PAD, PAD, PAD]]
    assert batch.position_ids.tolist() == [[0, 1, 0, 1, 2], [0, 1, 0, 1, 2]]
    assert batch.loss_mask.int().tolist() == [[0, 1, 0, 1, 1], [0, 1, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1] * 5, [1, 1, 0, 0, 0]]
    assert batch.model_inputs()["attention_mask"] is None  # documents attend by position


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_packed_logprobs_equal_each_document_alone(tokenizer, arch):
    model = build_tiny_model(tokenizer, arch=arch, seed=3)
    docs = documents([9, 6, 12, 7, 5, 3], seed=1)
    rows = pack_samples(docs, max_length=24)
    assert len(rows) >= 2 and any(len(segments(r)) >= 2 for r in rows)
    batch = collate_packed(rows, pad_token_id=PAD)
    assert (batch.input_ids == PAD).any()  # some row is padded
    with torch.no_grad():
        packed = sequence_logprobs(model, batch.input_ids, position_ids=batch.position_ids)
        plain = sequence_logprobs(model, batch.input_ids).logprobs  # one causal row, no packing
    seen, leaked = [], 0.0
    for r, row in enumerate(rows):
        for start, end in segments(row):
            ids = list(row.input_ids[start:end])
            seen.append(ids)
            with torch.no_grad():
                alone = sequence_logprobs(model, torch.tensor([ids])).logprobs[0, : end - start - 1]
            got = packed.logprobs[r, start : end - 1]
            torch.testing.assert_close(got, alone, rtol=0, atol=1e-5)
            leaked = max(leaked, (plain[r, start : end - 1] - alone).abs().max().item())
    assert sorted(seen) == sorted(d.input_ids for d in docs)
    assert leaked > 1e-3  # without restarting positions the documents would see each other


def test_packed_cross_entropy_equals_unpacked(tokenizer):
    model = build_tiny_model(tokenizer, seed=4)
    docs = documents([10, 4, 7, 13, 5, 8, 2], seed=2)
    unpacked = collate_sft(docs, pad_token_id=PAD)
    packed = collate_packed(pack_samples(docs, max_length=20), pad_token_id=PAD)

    def token_mean_ce(logprobs, loss_mask):
        scored = loss_mask[:, 1:]  # logprobs[:, t] scores token t + 1
        return -(logprobs[:, :-1] * scored).sum() / scored.sum(), scored.sum()

    with torch.no_grad():
        lp_unpacked = sequence_logprobs(model, unpacked.input_ids, unpacked.attention_mask).logprobs
        lp_packed = sequence_logprobs(
            model, packed.input_ids, position_ids=packed.position_ids
        ).logprobs
    ce_unpacked, n_unpacked = token_mean_ce(lp_unpacked, unpacked.loss_mask)
    ce_packed, n_packed = token_mean_ce(lp_packed, packed.loss_mask)
    assert n_packed == n_unpacked == sum(sum(d.loss_mask[1:]) for d in docs)
    assert packed.input_ids.shape[0] < unpacked.input_ids.shape[0]
    torch.testing.assert_close(ce_packed, ce_unpacked, rtol=0, atol=1e-5)

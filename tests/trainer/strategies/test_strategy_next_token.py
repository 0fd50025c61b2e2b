"""``seq`` and ``sft``: loss values against a naive full log-softmax, label smoothing against
``F.cross_entropy``, packed rows against the same documents unpacked."""

import math

import pytest
import torch
from strategy_testing import (
    PAD,
    build,
    naive_logprobs,
    naive_smoothed_ce,
    random_rows,
    sft_batch,
    tiny_policy,
)

from ardea.data import TrajectoryBatch
from ardea.trainer.step.updates import read_metrics

ROWS = random_rows([9, 6, 11], seed=1)
PROMPTS = [4, 2, 7]


def step_loss(strategy, batch):
    counts = strategy.step_counts([batch])
    loss, metrics = strategy.loss(batch, counts)
    return loss, read_metrics(metrics)  # as the trainer reads them


def test_sft_loss_is_token_mean_nll_of_answer_tokens():
    policy = tiny_policy()
    batch = sft_batch(ROWS, PROMPTS)
    loss, metrics = step_loss(build("sft", policy), batch)
    lp = naive_logprobs(policy, batch.input_ids, batch.attention_mask)  # (N, S-1)
    answer = batch.loss_mask[:, 1:]  # token t+1 is an answer token
    expected = -lp[answer].sum() / answer.sum()
    assert answer.sum() == sum(len(r) - p for r, p in zip(ROWS, PROMPTS))
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert metrics == {"train/loss": pytest.approx(expected.item(), abs=1e-6)}


def test_seq_loss_covers_every_real_token():
    policy = tiny_policy()
    batch = sft_batch(ROWS, PROMPTS)
    loss, _ = step_loss(build("seq", policy), batch)
    lp = naive_logprobs(policy, batch.input_ids, batch.attention_mask)
    real = batch.attention_mask[:, 1:].bool()
    assert real.sum() == sum(len(r) - 1 for r in ROWS)
    assert loss.item() == pytest.approx((-lp[real].mean()).item(), abs=1e-6)


@pytest.mark.parametrize("name", ["seq", "sft"])
def test_label_smoothing_matches_torch_cross_entropy(name):
    policy = tiny_policy()
    batch = sft_batch(ROWS, PROMPTS)
    loss, _ = step_loss(build(name, policy, label_smoothing=0.1), batch)
    key = "loss_mask" if name == "sft" else "attention_mask"
    counted = getattr(batch, key)[:, 1:].bool()
    expected = naive_smoothed_ce(policy, batch, counted, 0.1)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    plain, _ = step_loss(build(name, policy), batch)
    assert abs(loss.item() - plain.item()) > 1e-4  # smoothing changes the loss


def test_zero_label_smoothing_paths_agree():
    """The chunked log-prob path (smoothing 0) equals the logits path at a tiny smoothing."""
    policy = tiny_policy()
    batch = sft_batch(ROWS, PROMPTS)
    chunked, _ = step_loss(build("sft", policy), batch)
    logits_path, _ = step_loss(build("sft", policy, label_smoothing=1e-9), batch)
    assert chunked.item() == pytest.approx(logits_path.item(), abs=1e-6)


def packed(rows, masks, pad: int = 0):
    """One packed row, documents back to back with ``position_ids`` restarting per document,
    then ``pad`` padding tokens (a document of their own, never trained)."""
    ids = sum(rows, []) + [PAD] * pad
    return TrajectoryBatch.from_tensors(
        torch.tensor([ids]),
        torch.tensor([[1] * (len(ids) - pad) + [0] * pad]),
        torch.tensor([sum(masks, []) + [0] * pad]).bool(),
        position_ids=torch.tensor(
            [sum((list(range(len(r))) for r in rows), []) + list(range(pad))]
        ),
    )


@pytest.mark.parametrize("name", ["seq", "sft"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_packed_rows_give_the_unpacked_loss(name, smoothing):
    policy = tiny_policy()
    unpacked = sft_batch(ROWS, PROMPTS)
    if name == "seq":  # a text row trains every token, document starts included in its mask
        masks = [[1] * len(r) for r in ROWS]
    else:
        masks = [[0] * p + [1] * (len(r) - p) for r, p in zip(ROWS, PROMPTS)]
    strategy = build(name, policy, label_smoothing=smoothing)
    expected, _ = step_loss(strategy, unpacked)
    got, _ = step_loss(strategy, packed(ROWS, masks))
    assert got.item() == pytest.approx(expected.item(), abs=2e-6)
    if name == "seq":  # first tokens of documents 2 and 3 are not predicted across documents
        assert strategy.step_counts([packed(ROWS, masks)])["tokens"] == sum(map(len, ROWS)) - 3


def test_packed_padding_is_not_trained():
    policy = tiny_policy()
    rows = ROWS[:2]
    masks = [[0] * 4 + [1] * 5, [0] * 2 + [1] * 4]
    batch = packed(rows, masks)
    pad = packed(rows, masks, pad=3)
    strategy = build("sft", policy)
    assert step_loss(strategy, pad)[0].item() == pytest.approx(
        step_loss(strategy, batch)[0].item(), abs=2e-6
    )


def test_untrained_batch_gives_zero_loss_not_nan():
    policy = tiny_policy()
    batch = sft_batch(ROWS, [len(r) for r in ROWS])  # prompts only
    loss, metrics = step_loss(build("sft", policy), batch)
    assert loss.item() == 0.0 and not math.isnan(metrics["train/loss"])

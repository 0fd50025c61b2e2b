"""Helpers for the strategy tests: a tiny policy, a config, batches built as tensors, and
naive reference log-probs (full forward + float64 log-softmax, no ardea code)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from tiny_models import small_model

from ardea.config import ArdeaConfig
from ardea.data import TrajectoryBatch
from ardea.model import build_char_tokenizer
from ardea.trainer.step.updates import add_metric, read_metrics
from ardea.trainer.strategies import make_strategy

TOKENIZER = build_char_tokenizer()
PAD = TOKENIZER.pad_token_id


def tiny_policy(seed: int = 0) -> torch.nn.Module:
    return small_model(TOKENIZER, seed=seed)


def make_config(name: str, **algo) -> ArdeaConfig:
    """``ArdeaConfig()`` with ``algo.name`` and the given ``algo`` fields (``ppo`` and
    ``mismatch`` fields as ``ppo_<field>``, ``mismatch_<field>``)."""
    config = ArdeaConfig()
    config.algo.name = name
    for key, value in algo.items():
        section, _, field = key.partition("_")
        if section in ("ppo", "mismatch"):
            setattr(getattr(config.algo, section), field, value)
        else:
            setattr(config.algo, key, value)
    return config


def build(name: str, policy, reference=None, **algo):
    """The strategy ``name`` on ``policy``; ``make_reference`` returns a copy of ``reference``
    (default: of ``policy`` as it is now)."""
    source = copy.deepcopy(policy if reference is None else reference)
    return make_strategy(
        name,
        policy,
        make_config(name, **algo),
        tokenizer=TOKENIZER,
        make_reference=lambda: copy.deepcopy(source),
    )


def random_rows(lengths: Sequence[int], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 200, (n,), generator=generator).tolist() for n in lengths]


def pad_rows(rows: Sequence[Sequence[float]], value: float = 0, dtype=torch.long) -> torch.Tensor:
    """Right-pad lists into an ``(N, S)`` tensor."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def sft_batch(rows: Sequence[Sequence[int]], prompt_lengths: Sequence[int]) -> TrajectoryBatch:
    """Rows whose ``loss_mask`` is 1 after the prompt."""
    masks = [[0] * p + [1] * (len(r) - p) for r, p in zip(rows, prompt_lengths)]
    return TrajectoryBatch.from_tensors(
        pad_rows(rows, PAD), pad_rows([[1] * len(r) for r in rows]), pad_rows(masks).bool()
    )


def naive_logprobs(model, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
    """``(N, S - 1)``: entry ``t`` is ``log p(input_ids[:, t + 1] | input_ids[:, :t + 1])``."""
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
    ).logits
    log_probs = torch.log_softmax(logits[:, :-1].double(), dim=-1)
    return log_probs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def naive_smoothed_ce(model, batch, counted: torch.Tensor, smoothing: float) -> torch.Tensor:
    """``F.cross_entropy(label_smoothing=...)`` mean over the ``counted (N, S - 1)`` positions."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return F.cross_entropy(
        logits[:, :-1][counted].float(),
        batch.input_ids[:, 1:][counted],
        label_smoothing=smoothing,
    )


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def run_step(strategy, micro_batches) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """The loop's forward/backward: summed metrics and the accumulated gradients."""
    strategy.policy.zero_grad(set_to_none=True)
    counts = strategy.step_counts(micro_batches)
    totals: dict = {}
    for batch in micro_batches:
        loss, metrics = strategy.loss(batch, counts)
        loss.backward()
        for name, value in metrics.items():
            add_metric(totals, name, value)
    return read_metrics(totals), grads(strategy.policy)


def online_strategy(name: str, policy, **algo):
    """The online strategy ``name`` on ``policy`` (the reference is a copy of it)."""
    source = copy.deepcopy(policy)
    return make_strategy(
        name,
        policy,
        make_config(name, **algo),
        tokenizer=TOKENIZER,
        make_reference=lambda: copy.deepcopy(source),
    )


def rollout_batch(lengths, prompt: int, rewards, *, seed: int = 0, no_eos=None) -> TrajectoryBatch:
    """A rollout: rows of ``prompt`` prompt tokens then a completion (version 0, turn 0),
    behaviour log-probs ``-0.5`` on completion tokens, one group per two rows."""
    rows = random_rows(lengths, seed)
    n = len(lengths)
    loss = pad_rows([[0] * prompt + [1] * (k - prompt) for k in lengths]).bool()
    return TrajectoryBatch.from_tensors(
        pad_rows(rows, PAD),
        pad_rows([[1] * k for k in lengths]),
        loss,
        logprobs=-0.5 * loss.float(),
        rewards=torch.tensor(rewards, dtype=torch.float32),
        group_ids=torch.arange(n) // 2,
        no_eos=torch.tensor(no_eos if no_eos is not None else [False] * n),
        versions=torch.where(loss, 0, -1),
    )

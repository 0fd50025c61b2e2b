"""Supervised examples: prompt + answer token ids, loss only on the answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ardea.data.prompts import encode_answer, encode_prompt
from ardea.data.tasks import Example
from ardea.data.trajectory import TrajectoryBatch


@dataclass(frozen=True)
class SFTSample:
    """One tokenized sequence; ``loss_mask[t] = 1`` on the answer tokens (and eos)."""

    input_ids: list[int]
    loss_mask: list[int]


def tokenize_examples(
    tokenizer: Any, examples: Sequence[Example], *, chat_template: bool = False, max_length: int
) -> list[SFTSample]:
    """Prompt ids followed by answer ids + eos; raise if one exceeds ``max_length``."""
    samples = []
    for index, example in enumerate(examples):
        prompt = encode_prompt(tokenizer, example.prompt, chat_template=chat_template)
        answer = encode_answer(tokenizer, example.demonstrated)
        if len(prompt) + len(answer) > max_length:
            raise ValueError(
                f"example {index} has {len(prompt) + len(answer)} tokens, more than the model's "
                f"context of {max_length}: {example.prompt[:60]!r}"
            )
        samples.append(SFTSample(prompt + answer, [0] * len(prompt) + [1] * len(answer)))
    return samples


def collate_sft(samples: Sequence[SFTSample], pad_token_id: int) -> TrajectoryBatch:
    """Right-pad samples into a :class:`~ardea.data.TrajectoryBatch` whose ``loss_mask`` is
    1 on the answer tokens (each contiguous answer span one turn)."""
    if not samples:
        raise ValueError("cannot collate an empty list of SFT samples")
    length = max(len(s.input_ids) for s in samples)
    input_ids = torch.full((len(samples), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(samples), length), dtype=torch.long)
    loss_mask = torch.zeros((len(samples), length), dtype=torch.bool)
    for row, sample in enumerate(samples):
        n = len(sample.input_ids)
        input_ids[row, :n] = torch.tensor(sample.input_ids)
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(sample.loss_mask, dtype=torch.bool)
    return TrajectoryBatch.from_tensors(input_ids, attention_mask, loss_mask)

"""Preference records (prompt, chosen, rejected) → samples and DPO batches.

Chosen and rejected ids end with eos (raw-text prompts) or with the chat template's
end-of-turn marker (chat prompts, e.g. ``<|im_end|>``): both are what the model generates
last. Both responses follow the same prompt ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ardea.data.chat import check_fits, prompt_and_completion_ids
from ardea.data.records import Record


@dataclass(frozen=True)
class PreferenceSample:
    """One preference pair: ``prompt_ids`` followed by either response."""

    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]


def tokenize_preference(
    tokenizer: Any, record: Record, *, max_length: int, chat_template: bool
) -> PreferenceSample:
    """A ``{"prompt", "chosen", "rejected"}`` record → :class:`PreferenceSample`; each of
    chosen/rejected is a string or a list of one assistant message."""
    prompt = record.data["prompt"]
    prompt_ids, chosen = prompt_and_completion_ids(
        tokenizer, record, prompt, record.data["chosen"], name="chosen", chat_template=chat_template
    )
    prompt_again, rejected = prompt_and_completion_ids(
        tokenizer,
        record,
        prompt,
        record.data["rejected"],
        name="rejected",
        chat_template=chat_template,
    )
    if prompt_again != prompt_ids:
        raise record.error("the prompt renders differently before 'chosen' and 'rejected'")
    longest = len(prompt_ids) + max(len(chosen), len(rejected))
    check_fits(record, len(prompt_ids), longest, max_length)
    return PreferenceSample(tuple(prompt_ids), tuple(chosen), tuple(rejected))


def _rows(
    samples: Sequence[PreferenceSample], which: str, length: int, pad_token_id: int
) -> dict[str, torch.Tensor]:
    n = len(samples)
    input_ids = torch.full((n, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, length), dtype=torch.long)
    loss_mask = torch.zeros((n, length), dtype=torch.float32)
    for row, sample in enumerate(samples):
        response = getattr(sample, f"{which}_ids")
        p, r = len(sample.prompt_ids), len(response)
        input_ids[row, : p + r] = torch.tensor(sample.prompt_ids + response, dtype=torch.long)
        attention_mask[row, : p + r] = 1
        loss_mask[row, p : p + r] = 1.0
    return {
        f"{which}_input_ids": input_ids,
        f"{which}_attention_mask": attention_mask,
        f"{which}_loss_mask": loss_mask,
    }


def collate_preference(
    samples: Sequence[PreferenceSample], pad_token_id: int
) -> dict[str, torch.Tensor]:
    """Right-pad chosen and rejected rows to ONE common length ``S`` (so the two halves can
    be concatenated into one ``[2N, S]`` forward).

    Returns:
        ``chosen_input_ids``, ``rejected_input_ids`` ``[N, S]`` long (prompt + response,
        then ``pad_token_id``); ``chosen_attention_mask``, ``rejected_attention_mask``
        ``[N, S]`` long (1 on real tokens); ``chosen_loss_mask``, ``rejected_loss_mask``
        ``[N, S]`` float32 (1 on response tokens). Token-aligned: column ``t`` describes
        ``input_ids[:, t]``.
    """
    if not samples:
        raise ValueError("cannot collate an empty list of preference samples")
    length = max(len(s.prompt_ids) + max(len(s.chosen_ids), len(s.rejected_ids)) for s in samples)
    return {
        **_rows(samples, "chosen", length, pad_token_id),
        **_rows(samples, "rejected", length, pad_token_id),
    }

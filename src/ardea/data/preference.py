"""Preference records (prompt, chosen, rejected) → samples and DPO batches.

Chosen and rejected ids end with eos (raw-text prompts) or with the chat template's
end-of-turn marker (chat prompts, e.g. ``<|im_end|>``): both are what the model generates
last. Both responses follow the same prompt ids.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ardea.data.chat import check_fits, prompt_and_completion_ids
from ardea.data.records import Record
from ardea.data.tasks import Task
from ardea.data.trajectory import Segment, Trajectory, TrajectoryBatch
from ardea.errors import ConfigError


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


def task_preference_samples(
    task: Task,
    split: str,
    n: int,
    tokenizer: Any,
    *,
    max_length: int,
    chat_template: bool,
) -> list[PreferenceSample]:
    """``n`` preference pairs from ``task``'s ``split``: each example's prompt with its
    reference answer as chosen and :meth:`~ardea.data.Task.wrong_answer` as rejected
    (drawn from a generator seeded by the task and split: the same pairs on every call).

    Raises:
        ConfigError: the task has no wrong answers to offer.
    """
    rng = random.Random(f"preference:{task.name}:{split}")
    samples = []
    for index, example in enumerate(task.examples(split, n)):
        wrong = task.wrong_answer(example, rng)
        if wrong is None:
            raise ConfigError(
                f"task {task.name!r} has no built-in preference pairs (no wrong answers); "
                "set data.path to a file of {prompt, chosen, rejected} records"
            )
        record = Record(
            {"prompt": example.prompt, "chosen": example.answer, "rejected": wrong},
            source=f"task {task.name} ({split})",
            line=index,
            unit="pair",
        )
        samples.append(
            tokenize_preference(
                tokenizer, record, max_length=max_length, chat_template=chat_template
            )
        )
    return samples


def collate_preference(samples: Sequence[PreferenceSample], pad_token_id: int) -> TrajectoryBatch:
    """``P`` pairs → a :class:`~ardea.data.TrajectoryBatch` of ``2P`` rows: the chosen
    responses in rows ``0..P-1``, the rejected ones in rows ``P..2P-1`` (the preference
    layout, :func:`preference_pairs`), each pair one group (``group_ids`` = pair index) with
    reward 1 for chosen and 0 for rejected."""
    if not samples:
        raise ValueError("cannot collate an empty list of preference samples")
    halves = [(s, s.chosen_ids, 1.0, i) for i, s in enumerate(samples)]
    halves += [(s, s.rejected_ids, 0.0, i) for i, s in enumerate(samples)]
    trajectories = [
        Trajectory(
            (Segment.prompt(s.prompt_ids), Segment.generated(ids)), reward=reward, group_id=pair
        )
        for s, ids, reward, pair in halves
    ]
    return TrajectoryBatch.from_trajectories(trajectories, pad_token_id=pad_token_id)


def preference_pairs(batch: TrajectoryBatch) -> tuple[Tensor, Tensor]:
    """``(chosen rows, rejected rows)`` of a batch in the preference layout: the first half
    of the rows chosen, the second half rejected, row ``i`` and ``i + P`` one pair (the same
    group id). Anything else is an error."""
    return halves(batch, "a preference batch holds chosen rows then rejected rows, row i and i + P")


def halves(batch: TrajectoryBatch, layout: str) -> tuple[Tensor, Tensor]:
    """``(first half, second half)`` row indices of a batch whose row ``i`` and ``i + B``
    share a group id, else an error starting with ``layout``."""
    rows = batch.rows
    half = rows // 2
    if rows % 2 or not torch.equal(batch.group_ids[:half], batch.group_ids[half:]):
        raise ValueError(
            f"{layout} sharing a group id; got {rows} rows with group ids "
            f"{batch.group_ids.tolist()[:8]}"
        )
    index = torch.arange(rows, device=batch.input_ids.device)
    return index[:half], index[half:]

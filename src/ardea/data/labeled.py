"""Labeled completions (KTO's unpaired preference data) → samples and KTO batches.

A record ``{"prompt", "completion", "label"}`` holds one completion and whether it is
desirable (``label: true``) or not, as in TRL's unpaired preference datasets. A paired record
``{"prompt", "chosen", "rejected"}`` gives two: the chosen completion desirable, the
rejected one not (TRL's ``unpair_preference_dataset``); so does a task's built-in pair.

A batch of ``B`` samples (:func:`collate_labeled`) has ``2B`` rows: the samples, then for
each sample ``i`` its *mismatched* row, sample ``i``'s prompt followed by the completion of
sample ``i - 1`` (cyclically), on which KTO estimates ``KL(pi || pi_ref)``; a mismatched
completion is cut to fit the batch's longest real row (it only feeds the estimate).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ardea.data.chat import check_fits, prompt_and_completion_ids
from ardea.data.preference import halves, task_preference_samples, tokenize_preference
from ardea.data.records import Record
from ardea.data.tasks import Task
from ardea.data.trajectory import Segment, Trajectory, TrajectoryBatch


@dataclass(frozen=True)
class LabeledSample:
    """One completion after its prompt, desirable or not."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    desirable: bool


def tokenize_labeled(
    tokenizer: Any, record: Record, *, max_length: int, chat_template: bool
) -> LabeledSample:
    """A ``{"prompt", "completion", "label"}`` record → :class:`LabeledSample`; the label must
    be a boolean (an integer 0 / 1 is refused: it is too easily a score)."""
    label = record.data["label"]
    if not isinstance(label, bool):
        raise record.error(
            f"field 'label' must be true (desirable) or false (undesirable), got {label!r}"
        )
    prompt_ids, completion = prompt_and_completion_ids(
        tokenizer, record, record.data["prompt"], record.data["completion"],
        name="completion", chat_template=chat_template,
    )  # fmt: skip
    check_fits(record, len(prompt_ids), len(prompt_ids) + len(completion), max_length)
    return LabeledSample(tuple(prompt_ids), tuple(completion), label)


def unpair_preference(
    tokenizer: Any, record: Record, *, max_length: int, chat_template: bool
) -> list[LabeledSample]:
    """A ``{"prompt", "chosen", "rejected"}`` record → its chosen completion (desirable) and
    its rejected one (undesirable)."""
    pair = tokenize_preference(
        tokenizer, record, max_length=max_length, chat_template=chat_template
    )
    return [
        LabeledSample(pair.prompt_ids, pair.chosen_ids, True),
        LabeledSample(pair.prompt_ids, pair.rejected_ids, False),
    ]


def task_labeled_samples(
    task: Task, split: str, n: int, tokenizer: Any, *, max_length: int, chat_template: bool
) -> list[LabeledSample]:
    """``2n`` samples from ``n`` of the task's built-in pairs
    (:func:`~ardea.data.task_preference_samples`), unpaired, then shuffled by a generator
    seeded by the task and split (so a batch is not all of one pair's two halves)."""
    pairs = task_preference_samples(
        task, split, n, tokenizer, max_length=max_length, chat_template=chat_template
    )
    samples = [
        LabeledSample(p.prompt_ids, ids, desirable)
        for p in pairs
        for ids, desirable in ((p.chosen_ids, True), (p.rejected_ids, False))
    ]
    random.Random(f"labeled:{task.name}:{split}").shuffle(samples)
    return samples


def collate_labeled(samples: Sequence[LabeledSample], pad_token_id: int) -> TrajectoryBatch:
    """``B`` samples → ``2B`` rows (module docstring): rows ``0..B-1`` the samples (reward 1
    desirable, 0 undesirable), rows ``B..2B-1`` the mismatched rows (reward 0); row ``i``
    and ``i + B`` share group id ``i`` (the layout :func:`labeled_rows` checks)."""
    if not samples:
        raise ValueError("cannot collate an empty list of labeled samples")
    longest = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    rows = [
        Trajectory(
            (Segment.prompt(s.prompt_ids), Segment.generated(s.completion_ids)),
            reward=1.0 if s.desirable else 0.0, group_id=i,
        )
        for i, s in enumerate(samples)
    ]  # fmt: skip
    for i, s in enumerate(samples):
        other = samples[i - 1].completion_ids[: longest - len(s.prompt_ids)]
        segments = (Segment.prompt(s.prompt_ids), Segment.generated(other))
        rows.append(Trajectory(segments, reward=0.0, group_id=i))
    return TrajectoryBatch.from_trajectories(rows, pad_token_id=pad_token_id)


def labeled_rows(batch: TrajectoryBatch) -> tuple[Tensor, Tensor, Tensor]:
    """``(sample rows, mismatched rows, desirable)`` of a batch in the layout of
    :func:`collate_labeled`, each ``(B,)``; anything else is an error."""
    rows, mismatched = halves(
        batch, "a KTO batch holds B labeled rows then their B mismatched rows, row i and i + B"
    )
    return rows, mismatched, batch.rewards[rows] > 0.5

"""Datasets, collation and built-in tasks.

Training data files are read into :class:`Record`s (:mod:`ardea.data.records`), whose shape
is detected from their keys (:mod:`ardea.data.shapes`), and tokenized into the samples of
one kind (:mod:`ardea.data.load`): ``text`` and ``sft`` → :class:`SFTSample` (optionally
packed, :mod:`ardea.data.packing`), ``preference`` → :class:`PreferenceSample`,
``labeled`` → :class:`LabeledSample` (KTO), ``group`` → :class:`GroupSample`, ``prompt``
→ :class:`PromptSample` (online RL prompts whose other columns reach the reward functions,
:mod:`ardea.data.prompt_data`). Each sample type has its
``collate_*`` function producing a :class:`TrajectoryBatch` (:mod:`ardea.data.trajectory`),
the one layout every strategy consumes and rollouts produce, built from prompt / generated /
context segments.
"""

from ardea.data.chat import chat_tokens
from ardea.data.groups import GroupSample, collate_groups
from ardea.data.labeled import (
    LabeledSample,
    collate_labeled,
    labeled_rows,
    task_labeled_samples,
)
from ardea.data.load import Sample, load_samples, tokenize_records
from ardea.data.packing import PackedSample, collate_packed, pack_samples
from ardea.data.preference import (
    PreferenceSample,
    collate_preference,
    preference_pairs,
    task_preference_samples,
)
from ardea.data.prompt_data import PromptSample, RolloutPrompt, reward_row, rollout_prompt_ids
from ardea.data.prompts import encode_answer, encode_prompt
from ardea.data.records import Record, read_records
from ardea.data.sft import SFTSample, collate_sft, tokenize_examples
from ardea.data.shapes import KIND_SHAPES, detect_format
from ardea.data.tasks import Example, Task, make_task, read_examples, register_task, task_names
from ardea.data.trajectory import Segment, Trajectory, TrajectoryBatch, action_positions

__all__ = [
    "KIND_SHAPES",
    "Example",
    "GroupSample",
    "PackedSample",
    "LabeledSample",
    "PreferenceSample",
    "PromptSample",
    "Record",
    "RolloutPrompt",
    "SFTSample",
    "Segment",
    "Sample",
    "Task",
    "Trajectory",
    "TrajectoryBatch",
    "action_positions",
    "chat_tokens",
    "collate_groups",
    "collate_packed",
    "collate_labeled",
    "collate_preference",
    "collate_sft",
    "detect_format",
    "encode_answer",
    "encode_prompt",
    "load_samples",
    "make_task",
    "read_examples",
    "pack_samples",
    "labeled_rows",
    "preference_pairs",
    "read_records",
    "register_task",
    "reward_row",
    "rollout_prompt_ids",
    "task_names",
    "task_labeled_samples",
    "task_preference_samples",
    "tokenize_examples",
    "tokenize_records",
]

"""Datasets, collation and built-in tasks."""

from ardea.data.prompts import encode_answer, encode_prompt
from ardea.data.sft import SFTSample, collate_sft, tokenize_examples
from ardea.data.tasks import Example, Task, make_task, register_task, task_names

__all__ = [
    "Example",
    "SFTSample",
    "Task",
    "collate_sft",
    "encode_answer",
    "encode_prompt",
    "make_task",
    "register_task",
    "task_names",
    "tokenize_examples",
]

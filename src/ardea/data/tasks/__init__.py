"""Built-in tasks with verifiable answers, created by registered name."""

from ardea.data.tasks import arithmetic as _arithmetic  # noqa: F401  (registers the task)
from ardea.data.tasks import countdown as _countdown  # noqa: F401  (registers the task)
from ardea.data.tasks import math_jsonl as _math_jsonl  # noqa: F401  (registers the task)
from ardea.data.tasks import reasoning_gym as _reasoning_gym  # noqa: F401  (registers it)
from ardea.data.tasks.answer_records import read_examples
from ardea.data.tasks.base import (
    SPLITS,
    Example,
    Task,
    make_task,
    register_task,
    task_class,
    task_names,
)

__all__ = [
    "SPLITS",
    "Example",
    "Task",
    "make_task",
    "read_examples",
    "register_task",
    "task_class",
    "task_names",
]

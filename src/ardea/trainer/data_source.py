"""Where a run's training samples come from: a data file or a built-in task.

The strategy says which kind of sample it needs (``text``, ``sft``, ``preference``,
``group``); a file named by ``data.path`` is read and tokenized into that kind, and
without a file the task named by ``data.task`` generates ``sft`` samples. With
``data.packing`` the ``text``/``sft`` samples are packed into rows of ``max_length``.
"""

from __future__ import annotations

from typing import Any

from ardea.config import ArdeaConfig
from ardea.data import Task, load_samples, pack_samples, tokenize_examples
from ardea.errors import ConfigError


def max_sequence_length(config: ArdeaConfig, context: int) -> int:
    """``data.max_length`` (0 = the model's context), never above the model's context."""
    wanted = config.data.max_length or context
    if wanted > context:
        raise ConfigError(f"data.max_length={wanted} exceeds the model's context of {context}")
    return wanted


def training_samples(
    config: ArdeaConfig, tokenizer: Any, kind: str, task: Task | None, *, max_length: int
) -> list[Any]:
    """The samples the strategy trains on, in a fixed order."""
    data = config.data
    if data.path:
        samples = load_samples(
            data.path, tokenizer, kind, max_length=max_length, chat_template=data.chat_template
        )
    elif kind == "sft" and task is not None:
        examples = task.examples("train", data.train_size)
        samples = tokenize_examples(
            tokenizer, examples, chat_template=data.chat_template, max_length=max_length
        )
    elif kind == "prompt" and task is not None:
        samples = task.examples("train", data.train_size)  # prompts; the runner samples answers
    else:
        raise ConfigError(
            f"algo.name={config.algo.name} trains on {kind!r} samples, which data.task="
            f"{data.task!r} does not provide; set data.path to a file of such records"
        )
    if data.packing:
        if kind not in ("text", "sft"):
            raise ConfigError(f"data.packing=true works for text/sft data, not {kind!r}")
        samples = pack_samples(samples, max_length)
    return samples


def eval_samples(config: ArdeaConfig, tokenizer: Any, kind: str, *, max_length: int) -> list[Any]:
    """Held-out samples from ``data.eval_path`` (empty when it is not set)."""
    if not config.data.eval_path:
        return []
    if kind == "prompt":
        raise ConfigError(
            f"data.eval_path is not used by online strategies (algo.name={config.algo.name}): "
            "they are evaluated on data.task's held-out split; unset data.eval_path"
        )
    return load_samples(
        config.data.eval_path,
        tokenizer,
        kind,
        max_length=max_length,
        chat_template=config.data.chat_template,
    )

"""Where a run's training samples come from: a data file or a built-in task.

The strategy says which kind of sample it needs (``text``, ``sft``, ``preference``,
``labeled``, ``group``, ``prompt``); a file named by ``data.path`` is read and tokenized into that kind,
and without a file the task named by ``data.task`` generates ``sft`` samples or, for online
strategies, ``prompt`` examples, and for preference strategies pairs of its right and a
plausibly wrong answer (``labeled``: the two as separate samples, for KTO) (an ``agent.env`` gives its rows and demonstrations, an
``agent.workflow`` plays the rows of ``data.path``: :mod:`ardea.agent.runs`). With ``data.packing`` the ``text``/``sft`` samples are
packed into rows of ``max_length``. A prompt file's prompts must leave room for
``rollout.max_new_tokens`` within ``max_length``.
"""

from __future__ import annotations

from typing import Any

from ardea.agent.runs import agent_samples
from ardea.config import ArdeaConfig
from ardea.data import (
    Task,
    load_samples,
    pack_samples,
    task_labeled_samples,
    task_preference_samples,
    tokenize_examples,
)
from ardea.errors import ConfigError

#: samples built from a task's right and wrong answers: pairs, or (KTO) the two unpaired
TASK_PAIRS = {"preference": task_preference_samples, "labeled": task_labeled_samples}


def max_sequence_length(config: ArdeaConfig, context: int) -> int:
    """``data.max_length`` (0 = the model's context), never above the model's context."""
    wanted = config.data.max_length or context
    if wanted > context:
        raise ConfigError(f"data.max_length={wanted} exceeds the model's context of {context}")
    return wanted


def _sample_length(config: ArdeaConfig, kind: str, max_length: int) -> int:
    """The longest sample of ``kind`` in a file: ``max_length``, or for prompts what is left
    of it after the completion's ``rollout.max_new_tokens``."""
    if kind != "prompt":
        return max_length
    room = max_length - config.rollout.max_new_tokens
    if room < 1:
        raise ConfigError(
            f"rollout.max_new_tokens={config.rollout.max_new_tokens} leaves no room for a "
            f"prompt in a sequence of {max_length} tokens (data.max_length or the model's "
            "context); lower it"
        )
    return room


def _load(config: ArdeaConfig, path: str, tokenizer: Any, kind: str, max_length: int):
    return load_samples(
        path,
        tokenizer,
        kind,
        max_length=_sample_length(config, kind, max_length),
        chat_template=config.data.chat_template,
    )


def training_samples(
    config: ArdeaConfig, tokenizer: Any, kind: str, task: Task | None, *, max_length: int
) -> list[Any]:
    """The samples the strategy trains on, in a fixed order."""
    data = config.data
    if config.agent.workflow is not None:  # the rows of data.path, played by the workflow
        samples = agent_samples(config, tokenizer, kind, max_length=max_length)
    elif data.path:
        samples = _load(config, data.path, tokenizer, kind, max_length)
    elif config.agent.env is not None:
        samples = agent_samples(config, tokenizer, kind, max_length=max_length)
    elif kind == "sft" and task is not None:
        examples = task.examples("train", data.train_size)
        samples = tokenize_examples(
            tokenizer, examples, chat_template=data.chat_template, max_length=max_length
        )
    elif kind == "prompt" and task is not None:
        samples = task.examples("train", data.train_size)  # prompts; the runner samples answers
    elif kind in TASK_PAIRS and task is not None:  # right against plausibly wrong answers
        samples = TASK_PAIRS[kind](
            task,
            "train",
            data.train_size,
            tokenizer,
            max_length=max_length,
            chat_template=data.chat_template,
        )
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


def eval_samples(
    config: ArdeaConfig, tokenizer: Any, kind: str, task: Task | None, *, max_length: int
) -> list[Any]:
    """Held-out samples from ``data.eval_path`` (empty when it is not set); for online
    strategies a file of prompt records, scored by the reward functions (an agent
    workflow's held-out rows are its evaluation's, :mod:`ardea.agent.runs`).
    Preference strategies on a task without a file get ``data.eval_size`` pairs of the
    task's held-out split (KTO: their halves)."""
    data = config.data
    if kind in TASK_PAIRS and task is not None and not data.eval_path and not data.path:
        return TASK_PAIRS[kind](
            task,
            "test",
            data.eval_size,
            tokenizer,
            max_length=max_length,
            chat_template=data.chat_template,
        )
    if not config.data.eval_path or config.agent.workflow is not None:
        return []
    return _load(config, config.data.eval_path, tokenizer, kind, max_length)

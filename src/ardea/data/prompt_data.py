"""Prompt datasets for online RL: records ``{"prompt": str | messages, <any other columns>}``.

An online strategy completes prompts with the live policy and scores the completions with
reward functions; the prompts come from a built-in task (:class:`~ardea.data.Example`) or
from a file of prompt records (:class:`PromptSample`), as in TRL's GRPO datasets. Both are
*rollout prompts*; what the rollout runner needs from either is given by two functions:

- :func:`rollout_prompt_ids` — the token ids the engine completes: a string prompt as raw
  text (or as one user turn with ``data.chat_template``), a message list rendered with the
  tokenizer's chat template and the assistant's generation prompt;
- :func:`reward_row` — the row the reward functions receive with each completion. For a
  prompt record it is the record itself, every column at the top level as it is in the file
  (``row["prompt"]``, ``row["answer"]``, any other column; nulls included); for a task
  example it is ``{"prompt", "answer", "meta"}``, exactly the row a file with those three
  columns would give. Answer checks such as ``exact_match`` read ``row["answer"]`` either way.

A prompt record is tokenized once, when the file is read; a bad one is an error naming the
file, line and field (a missing or mistyped ``prompt``, a prompt that encodes to no tokens
or leaves no room for the completion).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ardea.data.chat import as_messages, generation_prompt_ids
from ardea.data.prompts import encode_prompt
from ardea.data.records import Record
from ardea.data.shapes import expect_text_or_messages
from ardea.data.tasks import Example


@dataclass(frozen=True)
class PromptSample:
    """One prompt record of an online-RL dataset.

    Attributes:
        prompt_ids: the tokens the engine completes (module docstring).
        row: the record's columns, ``prompt`` included, as the reward functions see them.
    """

    prompt_ids: tuple[int, ...]
    row: dict[str, Any]

    @property
    def prompt(self) -> str | list[dict[str, Any]]:
        """The prompt as written in the record: a string or a list of messages."""
        return self.row["prompt"]


RolloutPrompt = Example | PromptSample


def tokenize_prompt(
    tokenizer: Any, record: Record, *, max_length: int, chat_template: bool
) -> PromptSample:
    """A ``{"prompt", ...}`` record → :class:`PromptSample`.

    ``max_length`` is the longest prompt in tokens: the context minus the room the completion
    needs. A message list (or a string with ``chat_template``) always goes through the chat
    template, with the record's ``tools`` column when it has one.
    """
    prompt = expect_text_or_messages(record, "prompt", record.data["prompt"])
    if isinstance(prompt, str) and not chat_template:
        ids = encode_prompt(tokenizer, prompt)
    else:
        messages = as_messages(record, "prompt", prompt, "user")
        ids = generation_prompt_ids(tokenizer, messages, record, tools=record.data.get("tools"))
    if not ids:
        raise record.error("field 'prompt' encodes to no tokens; every prompt needs one")
    if len(ids) > max_length:
        raise record.error(
            f"the prompt is {len(ids)} tokens, more than max_length={max_length} (the longest "
            "prompt that leaves room for rollout.max_new_tokens); shorten it, raise "
            "data.max_length or lower rollout.max_new_tokens"
        )
    return PromptSample(tuple(ids), dict(record.data))


def rollout_prompt_ids(tokenizer: Any, item: RolloutPrompt, *, chat_template: bool) -> list[int]:
    """The token ids the engine completes for a task example or a prompt record."""
    if isinstance(item, PromptSample):
        return list(item.prompt_ids)
    return encode_prompt(tokenizer, item.prompt, chat_template=chat_template)


def reward_row(item: RolloutPrompt) -> dict[str, Any]:
    """The row reward functions receive with each completion of ``item`` (module
    docstring): a prompt record's columns, or a task example's ``{"prompt", "answer",
    "meta"}``. A fresh dict each call, so a reward function cannot change the dataset."""
    if isinstance(item, PromptSample):
        return dict(item.row)
    # not the demonstration: what a demonstrator wrote is SFT's business, not the verifier's
    return {"prompt": item.prompt, "answer": item.answer, "meta": copy.deepcopy(item.meta)}

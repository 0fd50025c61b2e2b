"""From records to the training samples of one sample kind.

    kind          record shapes                      sample
    text          {"text"}                           SFTSample chunks, loss on every token
    sft           {"messages"}, {"prompt",           SFTSample, loss on assistant /
                  "completion"}                      completion tokens only
    preference    {"prompt", "chosen", "rejected"}   PreferenceSample
    labeled       {"prompt", "completion", "label"}, LabeledSample (KTO; a pair gives
                  {"prompt", "chosen", "rejected"}   two: chosen desirable, rejected not)
    group         {"prompt", "completions",          GroupSample
                  "rewards", "logprobs"?}
    prompt        {"prompt", <any other columns>}    PromptSample (online RL; the other
                                                     columns reach the reward functions)

Nothing is truncated: a record longer than ``max_length`` is an error naming the file,
line, token count and limit (``text`` records are cut into chunks instead). For ``prompt`` samples ``max_length`` is the
longest prompt, the context minus the room the completion needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ardea.data.chat import tokenize_chat, tokenize_prompt_completion
from ardea.data.groups import GroupSample, tokenize_group
from ardea.data.labeled import LabeledSample, tokenize_labeled, unpair_preference
from ardea.data.preference import PreferenceSample, tokenize_preference
from ardea.data.prompt_data import PromptSample, tokenize_prompt
from ardea.data.records import Record, read_records
from ardea.data.sft import SFTSample
from ardea.data.shapes import KIND_SHAPES, check_kind
from ardea.data.text import tokenize_text
from ardea.errors import ArdeaError

Sample = SFTSample | PreferenceSample | LabeledSample | GroupSample | PromptSample


def _tokenize_one(
    tokenizer: Any, record: Record, kind: str, max_length: int, chat_template: bool
) -> list[Sample]:
    shape = check_kind(record, kind)
    options = {"max_length": max_length, "chat_template": chat_template}
    if kind == "labeled":
        if shape == "preference":
            return unpair_preference(tokenizer, record, **options)
        return [tokenize_labeled(tokenizer, record, **options)]
    if shape == "text":
        return list(tokenize_text(tokenizer, record, max_length=max_length))
    if shape == "chat":
        return [tokenize_chat(tokenizer, record, max_length=max_length)]
    if shape == "prompt_completion":
        return [
            tokenize_prompt_completion(
                tokenizer, record, max_length=max_length, chat_template=chat_template
            )
        ]
    if shape == "prompt":
        return [
            tokenize_prompt(tokenizer, record, max_length=max_length, chat_template=chat_template)
        ]
    if shape == "preference":
        return [
            tokenize_preference(
                tokenizer, record, max_length=max_length, chat_template=chat_template
            )
        ]
    return [tokenize_group(tokenizer, record, max_length=max_length, chat_template=chat_template)]


def tokenize_records(
    records: Sequence[Record],
    tokenizer: Any,
    kind: str,
    *,
    max_length: int,
    chat_template: bool = False,
) -> list[Sample]:
    """Tokenize ``records`` into samples of ``kind`` (see module docstring), in order.

    Args:
        records: from :func:`~ardea.data.records.read_records` (or built in memory).
        tokenizer: a Hugging Face tokenizer (with an eos token; with a chat template for
            conversational records or ``chat_template=True``).
        kind: ``text``, ``sft``, ``preference``, ``labeled``, ``group`` or ``prompt``.
        max_length: the longest sample in tokens (>= 1).
        chat_template: render *string* prompts as a user turn with the chat template;
            message lists always use it.

    Raises:
        ArdeaError: a record has the wrong shape for ``kind``, a missing or mistyped
            field, or more than ``max_length`` tokens.
    """
    if kind not in KIND_SHAPES:
        raise ArdeaError(f"unknown sample kind {kind!r}; known kinds: {', '.join(KIND_SHAPES)}")
    if max_length < 1:
        raise ArdeaError(f"max_length must be >= 1, got {max_length}")
    samples: list[Sample] = []
    for record in records:
        samples += _tokenize_one(tokenizer, record, kind, max_length, chat_template)
    return samples


def load_samples(
    path: str | Path,
    tokenizer: Any,
    kind: str,
    *,
    max_length: int,
    chat_template: bool = False,
) -> list[Sample]:
    """:func:`read_records` + :func:`tokenize_records`; a file that yields no sample (e.g.
    only empty texts) is an error, never an empty run."""
    samples = tokenize_records(
        read_records(path), tokenizer, kind, max_length=max_length, chat_template=chat_template
    )
    if not samples:
        raise ArdeaError(f"{path} holds no usable records for {kind!r} samples")
    return samples

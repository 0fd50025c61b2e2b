"""A learned reward model as a reward function: ``reward_model`` scores each completion with
a Hugging Face sequence-classification model of one label from a local directory (one that
``AutoModelForSequenceClassification.from_pretrained`` loads, with its tokenizer)::

    reward:
      functions:
        - {name: reward_model, kwargs: {path: /models/my-rm}}
        - {name: task, weight: 0.5}

The text scored is the prompt followed by the completion and the tokenizer's eos token,
tokenized by the directory's tokenizer; a conversational prompt (a list of messages) is
rendered by its chat template with the completion as the assistant's reply, up to that
reply's end-of-turn marker. Both end where a preference pair's replies end when
``algo.name: reward_model`` trains on them (raw text: eos; chat: the end-of-turn marker),
so the model judges a completion as it was trained to. The score is the model's one logit at
the last token of the text (for a Bradley–Terry model, the log-odds scale on which a preferred
reply scores higher). Texts longer than the model's context keep their last tokens (the
completion's end is what is judged). Scoring is batched (``batch_size`` texts, longest
first, padded on the right) without gradients, in ``dtype`` (``float32``, or ``bfloat16``
where the CPU or GPU computes it fast), on ``device``; the model is loaded once per
directory, dtype and device in a process.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from ardea.errors import ConfigError
from ardea.reward.registry import register_reward

DTYPES = ("float32", "bfloat16")
_LOAD_LOCK = threading.Lock()  # two scoring threads load a directory once


def _check(*, path: str, batch_size: int = 32, dtype: str = "float32", device: str = "cpu"):
    if not isinstance(path, str) or not (Path(path) / "config.json").is_file():
        raise ConfigError(
            f"reward_model: path={path!r} is not a model directory (no config.json); give "
            "a local directory that AutoModelForSequenceClassification.from_pretrained loads"
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"reward_model: batch_size={batch_size!r} must be an integer >= 1")
    if dtype not in DTYPES:
        raise ConfigError(f"reward_model: dtype={dtype!r}; choose one of {', '.join(DTYPES)}")
    try:
        torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"reward_model: device={device!r} is not a torch device") from exc


@functools.lru_cache(maxsize=4)
def _load(path: str, dtype: str, device: str) -> tuple[Any, Any]:
    """The model (eval mode, no gradients) and tokenizer of ``path``; ConfigError when the
    model does not give one score per text."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=getattr(torch, dtype))
    if model.config.num_labels != 1:
        raise ConfigError(
            f"reward_model: {path} has num_labels={model.config.num_labels}; a reward model "
            "gives one score per text (num_labels=1)"
        )
    if model.config.pad_token_id is None:  # the classifier finds each text's last token by it
        model.config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).eval().requires_grad_(False), tokenizer


def _ids(tokenizer: Any, prompt: Any, completion: str) -> list[int]:
    """The token ids scored for ``prompt`` + ``completion`` (module docstring)."""
    if isinstance(prompt, str):
        ids = tokenizer(prompt + completion, add_special_tokens=False)["input_ids"]
        eos = tokenizer.eos_token_id
        return ids + [eos] if eos is not None and ids[-1:] != [eos] else ids
    messages = list(prompt) + [{"role": "assistant", "content": completion}]
    text = tokenizer.apply_chat_template(messages, tokenize=False).rstrip()  # ends the turn
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@register_reward("reward_model", check=_check)
def reward_model(
    prompts: list[Any],
    completions: list[str],
    rows: list[dict],
    *,
    path: str,
    batch_size: int = 32,
    dtype: str = "float32",
    device: str = "cpu",
) -> list[float]:
    """The reward model's score of each prompt + completion (module docstring)."""
    with _LOAD_LOCK:
        model, tokenizer = _load(path, dtype, device)
    limit = getattr(model.config, "max_position_embeddings", None)
    ids = [_ids(tokenizer, p, c) for p, c in zip(prompts, completions)]
    ids = [row[-limit:] if limit else row for row in ids]  # keep the completion's end
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    scores = [0.0] * len(ids)
    pad = model.config.pad_token_id
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        width = max(len(ids[i]) for i in chunk)
        batch = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, i in enumerate(chunk):
            batch[row, : len(ids[i])] = torch.tensor(ids[i])
            mask[row, : len(ids[i])] = 1
        with torch.inference_mode():
            logits = model(input_ids=batch.to(device), attention_mask=mask.to(device)).logits
        for i, value in zip(chunk, logits[:, 0].float().tolist()):
            scores[i] = value
    return scores

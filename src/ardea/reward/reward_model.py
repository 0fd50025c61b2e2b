"""A learned reward model as a reward function: ``reward_model`` scores each completion with
a Hugging Face sequence-classification model of one label from a local directory (one that
``AutoModelForSequenceClassification.from_pretrained`` loads, with its tokenizer)::

    reward:
      functions:
        - {name: reward_model, kwargs: {path: /models/my-rm}}
        - {name: task, weight: 0.5}

What is scored, in a rollout: the policy's own tokens. When the rollout gives the token ids
(:class:`~ardea.reward.TokenIds`) and the directory's tokenizer has the policy's vocabulary
(equal :func:`~ardea.reward.vocab_id` fingerprints, the directory's computed once when it is
loaded), the scored sequence is the prompt's ids followed by the completion's ids exactly as
sampled, so the model judges the tokens the policy generated, not a re-tokenization of their
decoded text (which can differ: a token sequence need not be the tokenizer's own encoding of
its text). A completion that did not end with an end id (the eos id, or the chat template's
end-of-turn marker: it was cut at the length limit or aborted) gets the end a preference
pair's reply has: eos after a text prompt, the end-of-turn marker after a conversational one.

The one other case: a reward model whose tokenizer is not the policy's (another family's
chat RM), or a caller with text only (evaluation, agent reward terms). The text is then
re-rendered with the directory's tokenizer: the prompt followed by the completion and the
tokenizer's eos token; a conversational prompt (a list of messages) is rendered by its chat
template with the completion as the assistant's reply, up to that reply's end-of-turn marker.

Both end where a preference pair's replies end when ``algo.name: reward_model`` trains on
them (raw text: eos; chat: the end-of-turn marker), so the model judges a completion as it
was trained to. The score is the model's one logit at the last token (for a Bradley–Terry
model, the log-odds scale on which a preferred reply scores higher). Sequences longer than
the model's context keep their last tokens (the completion's end is what is judged). Scoring
is batched (``batch_size`` sequences, longest first, padded on the right) without gradients,
in ``dtype`` (``float32``, or ``bfloat16`` where the CPU or GPU computes it fast), on
``device``; the model is loaded once per directory, dtype and device in a process.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from ardea.errors import ConfigError
from ardea.reward.registry import register_reward
from ardea.reward.token_ids import TokenIds, vocab_id

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


@dataclass(frozen=True)
class _Loaded:
    """A reward model directory, loaded: the model (eval mode, no gradients), its tokenizer,
    that tokenizer's :func:`vocab_id`, and the end ids a scored reply may end with."""

    model: Any
    tokenizer: Any
    vocab: str
    eos: int | None
    end_of_turn: int | None

    @property
    def ends(self) -> set[int]:
        return {i for i in (self.eos, self.end_of_turn) if i is not None}


@functools.lru_cache(maxsize=4)
def _load(path: str, dtype: str, device: str) -> _Loaded:
    """The reward model of ``path``; ConfigError when it does not give one score per text."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=getattr(torch, dtype))
    if model.config.num_labels != 1:
        raise ConfigError(
            f"reward_model: {path} has num_labels={model.config.num_labels}; a reward model "
            "gives one score per text (num_labels=1)"
        )
    if model.config.pad_token_id is None:  # the classifier finds each text's last token by it
        model.config.pad_token_id = tokenizer.pad_token_id
    model = model.to(device).eval().requires_grad_(False)
    eos = tokenizer.eos_token_id
    return _Loaded(model, tokenizer, vocab_id(tokenizer), eos, _end_of_turn(tokenizer))


def _end_of_turn(tokenizer: Any) -> int | None:
    """The special token the chat template ends an assistant turn with (None without a
    template, or when the turn does not end with a special token)."""
    turn = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    try:
        text = tokenizer.apply_chat_template(turn, tokenize=False).rstrip()
    except Exception:  # no template, or one that refuses this conversation: no marker
        return None
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids[-1] if ids and ids[-1] in tokenizer.all_special_ids else None


def _ids(tokenizer: Any, prompt: Any, completion: str) -> list[int]:
    """The token ids scored for ``prompt`` + ``completion`` re-rendered (module docstring)."""
    if isinstance(prompt, str):
        ids = tokenizer(prompt + completion, add_special_tokens=False)["input_ids"]
        eos = tokenizer.eos_token_id
        return ids + [eos] if eos is not None and ids[-1:] != [eos] else ids
    messages = list(prompt) + [{"role": "assistant", "content": completion}]
    text = tokenizer.apply_chat_template(messages, tokenize=False).rstrip()  # ends the turn
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _rollout_ids(rm: _Loaded, prompt: Any, prompt_ids: list[int], completion: list[int]):
    """The rollout's own ids: ``prompt_ids + completion``, plus the reply's end when the
    completion did not end with one (module docstring)."""
    if completion[-1:] and completion[-1] in rm.ends:
        return prompt_ids + completion
    end = rm.eos if isinstance(prompt, str) or rm.end_of_turn is None else rm.end_of_turn
    return prompt_ids + completion + ([] if end is None else [end])


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
    token_ids: TokenIds | None = None,
) -> list[float]:
    """The reward model's score of each prompt + completion: of the rollout's token ids
    when its tokenizer is the policy's, else of the re-rendered text (module docstring)."""
    with _LOAD_LOCK:
        rm = _load(path, dtype, device)
    if token_ids is not None and token_ids.vocab == rm.vocab:
        ids = [
            _rollout_ids(rm, p, list(pi), list(ci))
            for p, pi, ci in zip(prompts, token_ids.prompts, token_ids.completions)
        ]
    else:
        ids = [_ids(rm.tokenizer, p, c) for p, c in zip(prompts, completions)]
    limit = getattr(rm.model.config, "max_position_embeddings", None)
    ids = [row[-limit:] if limit else row for row in ids]  # keep the completion's end
    return _scores(rm.model, ids, batch_size, device)


def _scores(model: Any, ids: list[list[int]], batch_size: int, device: str) -> list[float]:
    """The model's logit at the last token of each of ``ids``, ``batch_size`` at a time
    (longest first, right-padded)."""
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    scores = [0.0] * len(ids)
    pad = model.config.pad_token_id
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        width = max(len(ids[i]) for i in chunk)
        batch = torch.full((len(chunk), width), pad, dtype=torch.long)  # (b, S)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)  # (b, S)
        for row, i in enumerate(chunk):
            batch[row, : len(ids[i])] = torch.tensor(ids[i])
            mask[row, : len(ids[i])] = 1
        with torch.inference_mode():
            logits = model(input_ids=batch.to(device), attention_mask=mask.to(device)).logits
        for i, value in zip(chunk, logits[:, 0].float().tolist()):
            scores[i] = value
    return scores

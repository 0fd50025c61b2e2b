"""Turning task text into token ids, the same way for training and for generation."""

from __future__ import annotations

from typing import Any


def encode_prompt(tokenizer: Any, prompt: str, *, chat_template: bool = False) -> list[int]:
    """Token ids of ``prompt`` as the model sees it before its answer.

    With ``chat_template`` the prompt becomes one user message rendered by the
    tokenizer's chat template with the assistant's generation prompt appended;
    otherwise it is the raw text without special tokens.
    """
    if chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "data.chat_template=true but the tokenizer has no chat_template; "
                "set data.chat_template=false or use a chat model"
            )
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # BatchEncoding in newer transformers
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def encode_answer(tokenizer: Any, answer: str) -> list[int]:
    """Token ids of an answer followed by the end-of-sequence token."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos_token; set one so answers can end")
    return list(tokenizer(answer, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]

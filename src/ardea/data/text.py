"""Plain-text records → :class:`SFTSample` chunks trained on every token.

A ``{"text": ...}`` record becomes its token ids (no special tokens added) followed by
eos, cut into consecutive chunks of at most ``max_length`` tokens; every token has loss
mask 1. A chunk of a single token is dropped: a next-token loss has nothing to score in
it (its token has no context in the chunk). Empty texts are skipped, so a corpus with blank
entries loads; a file with nothing but blank entries is an error of the caller (no
samples).
"""

from __future__ import annotations

from typing import Any

from ardea.data.records import Record
from ardea.data.sft import SFTSample
from ardea.data.shapes import expect_str


def tokenize_text(tokenizer: Any, record: Record, *, max_length: int) -> list[SFTSample]:
    """A ``{"text": str}`` record → its chunks (possibly none for an empty text)."""
    text = expect_str(record, "text", record.data["text"])
    if not text:
        return []
    if tokenizer.eos_token_id is None:
        raise record.error("the tokenizer has no eos_token; set one so texts can end")
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
    chunks = [ids[start : start + max_length] for start in range(0, len(ids), max_length)]
    return [SFTSample(chunk, [1] * len(chunk)) for chunk in chunks if len(chunk) > 1]

"""Shared fixtures of the data tests: the character tokenizer, one torch thread, and
independent spellings of its token ids (id = 6 + byte, ``<|im_start|>`` = 4,
``<|im_end|>`` = 5, ``<eos>`` = 2, ``<pad>`` = 0)."""

PAD, EOS, IM_START, IM_END = 0, 2, 4, 5


def b(text: str) -> list[int]:
    """Character-tokenizer ids of ``text``, written independently of the tokenizer."""
    return [6 + byte for byte in text.encode("utf-8")]

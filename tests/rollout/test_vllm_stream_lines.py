"""The vLLM stream's lines are split on newline bytes only: a token's text may hold U+2028 or
U+0085, which JSON leaves unescaped and text line splitting breaks at (a real failure: the
character tokenizer's vocabulary has such characters)."""

from __future__ import annotations

import json

from ardea.rollout.engines.vllm.requests import _event_lines


class Chunks:
    """Bytes as a response streams them (the parser reads ``iter_bytes`` only)."""

    def __init__(self, data: bytes, size: int) -> None:
        self.parts = [data[i : i + size] for i in range(0, len(data), size)]

    def iter_bytes(self):
        yield from self.parts


def test_lines_survive_unicode_separators_and_any_chunking():
    events = [{"choices": [{"text": f"a\u2028b\x85c{i}", "token_ids": [i]}]} for i in range(3)]
    data = b"".join(
        b"data: " + json.dumps(e, ensure_ascii=False).encode() + b"\r\n\r\n" for e in events
    )
    data += b"data: [DONE]\n\n"
    for size in (1, 3, 7, len(data)):
        lines = [line for line in _event_lines(Chunks(data, size)) if line]
        assert lines[-1] == b"data: [DONE]"
        assert [json.loads(line[6:]) for line in lines[:-1]] == events

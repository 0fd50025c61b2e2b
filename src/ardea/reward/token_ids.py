"""The token ids of a scored batch, for the reward functions that ask for them.

A function asks by declaring a keyword-only parameter ``token_ids``
(:func:`ardea.reward.registry.takes_token_ids`); the scorer then passes a :class:`TokenIds`
when its caller has the ids (the rollout runner: what the engine was given and sampled), and
``None`` when it has only text (evaluation, an agent episode's reward terms), so such a
function must score the text then. ``vocab`` names the tokenizer the ids belong to
(:func:`vocab_id`): a function with a tokenizer of its own compares it with its own
tokenizer's to know whether the ids mean to it what they meant to the policy.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TokenIds:
    """The ids of one batch, one entry per completion.

    Attributes:
        prompts: each sample's prompt ids, as the engine was given them (chat template
            applied when the run applies it).
        completions: each completion's ids exactly as sampled, its stop token included when
            it stopped on one (none when it was cut at the length limit or aborted).
        vocab: :func:`vocab_id` of the tokenizer both belong to.
    """

    prompts: list[list[int]]
    completions: list[list[int]]
    vocab: str

    def copy(self) -> TokenIds:
        """A copy whose lists one function may change without another seeing it."""
        return TokenIds(
            [list(p) for p in self.prompts], [list(c) for c in self.completions], self.vocab
        )


def vocab_id(tokenizer: Any) -> str:
    """A fingerprint of ``tokenizer``'s vocabulary (every token string and its id, added
    tokens included): two tokenizers with equal fingerprints give an id the same token.
    Reads ``get_vocab()`` once (tens of milliseconds for a 150k-token vocabulary)."""
    items = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()

"""Shared fixtures for the model tests: the character tokenizer and tiny models."""

import pytest
import torch

from ardea.model import build_tiny_model


@pytest.fixture
def policy(tokenizer):
    """A fresh default-size tiny Qwen2 policy (float32, eval mode)."""
    return build_tiny_model(tokenizer, seed=0)


@pytest.fixture
def small_policy(tokenizer):
    """A smaller tiny Qwen2 policy for tests that run many forwards."""
    return build_tiny_model(tokenizer, hidden_size=32, num_layers=2, intermediate_size=64, seed=1)


def random_ids(n: int, s: int, vocab: int = 262, seed: int = 0) -> torch.Tensor:
    """``(n, s)`` token ids drawn from a private generator."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, s), generator=generator)

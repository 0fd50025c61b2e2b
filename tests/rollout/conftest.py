"""Fixtures for the rollout tests."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["qwen2", "llama"])
def arch(request) -> str:
    return request.param


@pytest.fixture
def prompts() -> list[list[int]]:
    """Prompts of different lengths, so a batch is left-padded."""
    return [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [20], [30, 31, 32, 33], [40, 41]]

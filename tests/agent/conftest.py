"""Fixtures of the agent tests: the tiny default model (fp32) and its in-process engine."""

from __future__ import annotations

import pytest
import torch

from ardea.model import build_char_tokenizer, build_tiny_model
from ardea.rollout import EngineSpec, make_engine


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer(model_max_length=512)


@pytest.fixture(scope="module")
def model(tokenizer):
    model = build_tiny_model(
        tokenizer,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        max_position_embeddings=512,
        seed=0,
    )
    return model.to(torch.float32).eval()


@pytest.fixture
def engine(model, tokenizer):
    return make_engine("in_process", EngineSpec.of(model, tokenizer), module=model)

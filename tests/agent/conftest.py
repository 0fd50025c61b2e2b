"""Fixtures of the agent tests: the tiny default model (fp32) and its in-process engine."""

from __future__ import annotations

import pytest
import torch
from tiny_models import small_model

from ardea.model import build_char_tokenizer
from ardea.rollout import EngineSpec, make_engine


@pytest.fixture(scope="module")
def tokenizer():
    """The character tokenizer reporting 512 positions, the agent model's context."""
    return build_char_tokenizer(model_max_length=512)


@pytest.fixture(scope="module")
def model(tokenizer):
    model = small_model(tokenizer, max_position_embeddings=512)
    return model.to(torch.float32).eval()


@pytest.fixture
def engine(model, tokenizer):
    return make_engine("in_process", EngineSpec.of(model, tokenizer), module=model)

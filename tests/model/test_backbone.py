"""Finding a causal LM's backbone and LM head, and positions from an attention mask."""

import pytest
import torch
from torch import nn
from transformers import Gemma2Config, Gemma2ForCausalLM

from ardea.model import get_backbone, last_hidden_states, position_ids_from_mask, split_causal_lm

from .conftest import random_ids


def test_position_ids_from_mask():
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    expected = torch.tensor([[0, 1, 2, 2, 2], [0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]])
    assert torch.equal(position_ids_from_mask(mask), expected)
    assert torch.equal(position_ids_from_mask(mask.bool()), expected)


def test_split_finds_backbone_and_head(small_policy):
    backbone, head = split_causal_lm(small_policy)
    assert backbone is small_policy.model
    assert head is small_policy.lm_head
    assert get_backbone(small_policy) is small_policy.model
    ids = random_ids(2, 7)
    with torch.no_grad():
        assert torch.equal(head(last_hidden_states(backbone, ids)), small_policy(ids).logits)


def test_split_refuses_soft_capped_logits_and_non_models():
    config = Gemma2Config(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, final_logit_softcapping=5.0,
    )  # fmt: skip
    assert split_causal_lm(Gemma2ForCausalLM(config)) is None
    assert split_causal_lm(nn.Linear(2, 2)) is None
    with pytest.raises(ValueError, match="cannot find the backbone of Linear"):
        get_backbone(nn.Linear(2, 2))

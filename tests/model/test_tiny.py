"""The tiny default model: shape, size, determinism, and plain-transformers save/reload."""

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaForCausalLM,
    Qwen2ForCausalLM,
    Qwen3MoeForCausalLM,
)

from ardea.model import build_tiny_model

from .conftest import random_ids


def expected_param_count(v, h, layers, heads, kv_heads, inter, qkv_bias, tied):
    """Independent count: embedding, per-layer attention (+ q/k/v biases), SwiGLU MLP,
    two RMSNorms, final norm, LM head."""
    kv = h // heads * kv_heads
    attention = h * h + 2 * h * kv + h * h + ((h + 2 * kv) if qkv_bias else 0)
    per_layer = attention + 3 * h * inter + 2 * h
    return v * h + layers * per_layer + h + (0 if tied else v * h)


def test_default_config_and_size(tokenizer, policy):
    assert isinstance(policy, Qwen2ForCausalLM)
    config = policy.config
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (262, 128, 4)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert (config.intermediate_size, config.max_position_embeddings) == (384, 256)
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (0, 1, 2)
    assert config.tie_word_embeddings is False
    assert policy.lm_head.weight.data_ptr() != policy.model.embed_tokens.weight.data_ptr()
    assert config._attn_implementation == "sdpa"
    assert all(p.dtype == torch.float32 for p in policy.parameters())
    assert policy.generation_config.eos_token_id == [2, 5]
    assert policy.generation_config.pad_token_id == 0
    count = sum(p.numel() for p in policy.parameters())
    assert count == expected_param_count(262, 128, 4, 4, 2, 384, qkv_bias=True, tied=False)
    assert count == 855_680
    assert 700_000 <= count <= 900_000


def test_llama_and_tied_variants(tokenizer):
    llama = build_tiny_model(tokenizer, arch="llama")
    assert isinstance(llama, LlamaForCausalLM)
    assert llama.model.layers[0].self_attn.q_proj.bias is None
    assert sum(p.numel() for p in llama.parameters()) == expected_param_count(
        262, 128, 4, 4, 2, 384, qkv_bias=False, tied=False
    )
    tied = build_tiny_model(tokenizer, tie_word_embeddings=True)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert sum(p.numel() for p in tied.parameters()) == 855_680 - 262 * 128


def test_the_moe_variant(tokenizer):
    """Qwen3-MoE: no q/k/v biases, per-head q/k RMSNorms (head_dim 32 each), and each of the
    4 layers' MLP is 8 SwiGLU experts of 384 plus an 8-way router; 2 experts per token."""
    moe = build_tiny_model(tokenizer, arch="qwen3_moe")
    assert isinstance(moe, Qwen3MoeForCausalLM)
    config = moe.config
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (
        8, 2, 384,
    )  # fmt: skip
    dense = expected_param_count(262, 128, 4, 4, 2, 384, qkv_bias=False, tied=False)
    per_layer_extra = 2 * 32 + 7 * 3 * 128 * 384 + 8 * 128  # q/k norms, 7 more experts, router
    assert sum(p.numel() for p in moe.parameters()) == dense + 4 * per_layer_extra
    small = build_tiny_model(tokenizer, arch="qwen3_moe", num_experts=4, experts_per_token=1)
    assert (small.config.num_experts, small.config.num_experts_per_tok) == (4, 1)


def test_same_seed_same_weights_and_caller_rng_untouched(tokenizer):
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    first = build_tiny_model(tokenizer, seed=7)
    assert torch.equal(torch.rand(3), expected_next)  # global RNG not consumed
    second = build_tiny_model(tokenizer, seed=7)
    other = build_tiny_model(tokenizer, seed=8)
    for (name, a), b, c in zip(
        first.state_dict().items(), second.state_dict().values(), other.state_dict().values()
    ):
        assert torch.equal(a, b), name
        if name.endswith("proj.weight"):
            assert not torch.equal(a, c), name


def test_rejects_bad_shapes_and_unknown_arch(tokenizer):
    with pytest.raises(
        ValueError, match="unknown tiny model arch 'gpt2'; known: qwen2, llama, qwen3_moe"
    ):
        build_tiny_model(tokenizer, arch="gpt2")
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(tokenizer, hidden_size=130)
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(tokenizer, num_heads=4, num_kv_heads=3)


def test_save_and_plain_automodel_reload_gives_identical_logits(policy, tmp_path):
    policy.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert not list(tmp_path.glob("*.bin"))
    reloaded = AutoModelForCausalLM.from_pretrained(
        tmp_path, local_files_only=True, use_safetensors=True
    )
    assert type(reloaded) is type(policy)
    assert reloaded.generation_config.eos_token_id == [2, 5]
    ids = random_ids(3, 12)
    mask = torch.ones_like(ids)
    mask[0, 9:] = 0
    with torch.no_grad():
        expected = policy(ids, attention_mask=mask).logits
        got = reloaded(ids, attention_mask=mask).logits
    assert torch.equal(got, expected)


@pytest.mark.parametrize("stop_token", ["<eos>", "<|im_end|>"])
def test_greedy_generation_stops_at_eos_and_im_end(tokenizer, policy, stop_token):
    stop_id = tokenizer.convert_tokens_to_ids(stop_token)
    # Final hidden states are all ones and only the stop token's logit row is non-zero,
    # so greedy decoding picks it first and must stop there.
    policy.model.norm.register_forward_hook(lambda module, args, out: torch.ones_like(out))
    with torch.no_grad():
        policy.lm_head.weight.zero_()
        policy.lm_head.weight[stop_id] = 1.0
    prompt = tokenizer("12+3=", return_tensors="pt")
    out = policy.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert out[0, prompt["input_ids"].shape[1] :].tolist() == [stop_id]

"""Tiny Hugging Face causal LMs for the rollout tests (built here, independent of ardea.model)."""

from __future__ import annotations

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

VOCAB = 96
PAD = 0
EOS = 1


#: hybrid linear-attention families (transformers' classes): one linear-attention (gated
#: delta net) or short-convolution layer, then one full-attention layer
LINEAR = dict(head_dim=16, linear_num_value_heads=2, linear_num_key_heads=1,
              linear_key_head_dim=16, linear_value_head_dim=16,
              layer_types=["linear_attention", "full_attention"])  # fmt: skip
HYBRID = {
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   LINEAR | dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                 shared_expert_intermediate_size=32)),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", LINEAR),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(layer_types=["conv", "full_attention"])),
}  # fmt: skip

#: mixtures of experts (transformers' classes)
EXPERTS = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       norm_topk_prob=True)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=48)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32)),
}  # fmt: skip


def make_model(arch: str = "qwen2", seed: int = 0, **overrides) -> torch.nn.Module:
    """A 2-layer, hidden-64 fp32 causal LM.

    ``initializer_range=0.1`` (HF default 0.02) spreads the logits over about a nat, so greedy
    has no near-ties; :func:`sharpen` makes the next-token distribution peaked.
    """
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.1,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=None,
    )
    kwargs.update(overrides)
    attn = kwargs.pop("attn_implementation", "sdpa")
    torch.manual_seed(seed)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**kwargs))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**kwargs))
    elif arch == "qwen3":  # Qwen2 with per-head query/key RMSNorms and no q/k/v biases
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**kwargs))
    elif arch in EXPERTS:  # 4 experts, 2 per token, in every layer (Qwen2-MoE: + a shared one)
        config_class, model_class, extra = EXPERTS[arch]
        config = getattr(transformers, config_class)(**(kwargs | extra))
        model = getattr(transformers, model_class)(config)
    elif arch in HYBRID:
        config_class, model_class, extra = HYBRID[arch]
        config = getattr(transformers, config_class)(**(kwargs | extra))
        model = getattr(transformers, model_class)(config)
    else:
        raise ValueError(arch)
    model.config._attn_implementation = attn
    return model.float().eval()


def sharpen(model: torch.nn.Module, factor: float = 5.0) -> torch.nn.Module:
    """Scale the output head so logits spread over several nats (a peaked distribution)."""
    with torch.no_grad():
        model.lm_head.weight.mul_(factor)
    return model

"""The default tiny policy: a Qwen2 (or Llama) causal LM built from a config in code.

With the character tokenizer (V = 262) and the defaults below the model has 855,680
parameters (untied: 33,536 embedding + 4 x 197,120 decoder layers + 128 final norm +
33,536 LM head). It is an ordinary ``transformers`` model: ``save_pretrained(dir)`` writes
``config.json``, ``generation_config.json`` and ``model.safetensors`` and
``AutoModelForCausalLM.from_pretrained(dir)`` loads it with no ardea import.

Decisions a caller must know:

- Embeddings are untied by default (``tie_word_embeddings=False``): the 34k extra
  parameters are negligible, and separate input/output matrices keep weight export,
  sharding and the chunked LM head in :mod:`ardea.model.logprobs` free of aliasing.
- ``float32`` weights, ``attn_implementation="sdpa"``: on CPU it is as fast as ``eager`` for
  this size (both ~100 ms per forward+backward on a [64, 16] batch, one thread), agrees
  with it to ~3e-7 on attended positions, gives finite values on fully padded rows, and
  scales better with sequence length.
- ``generation_config.eos_token_id`` is the list ``[<eos>, <|im_end|>]`` when the tokenizer
  has ``<|im_end|>`` (so chat turns stop too), else ``[eos]``; ``config.eos_token_id`` stays
  the single ``<eos>`` id.
- Weights are drawn from ``seed`` under a forked RNG: the same seed gives bit-identical
  weights and the caller's global RNG state is left untouched.
"""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen3MoeConfig,
)

from ardea.config.schema import ARCHS

TINY_ARCHS = ARCHS  # the architectures model.arch chooses from


def _stop_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """``[eos]`` plus ``<|im_end|>`` when the tokenizer knows it (ChatML turn end)."""
    stops = [tokenizer.eos_token_id]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id and im_end not in stops:
        stops.append(im_end)
    return stops


def tiny_config(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 384,
    max_position_embeddings: int = 256,
    arch: str = "qwen2",
    tie_word_embeddings: bool = False,
    num_experts: int = 8,
    experts_per_token: int = 2,
) -> PretrainedConfig:
    """The ``Qwen2Config`` / ``LlamaConfig`` / ``Qwen3MoeConfig`` of the tiny model; arguments
    as in :func:`build_tiny_model`. Vocab size and special-token ids come from ``tokenizer``."""
    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny model arch {arch!r}; known: {', '.join(TINY_ARCHS)}")
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        raise ValueError("the tiny model's tokenizer needs an eos and a pad token")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads}) "
            f"and num_heads by num_kv_heads ({num_kv_heads})"
        )
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        hidden_act="silu",
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if arch == "qwen2":
        return Qwen2Config(**common)
    if arch == "qwen3_moe":  # every layer sparse; head_dim as the dense archs'
        return Qwen3MoeConfig(
            **common, head_dim=hidden_size // num_heads, num_experts=num_experts,
            num_experts_per_tok=experts_per_token, moe_intermediate_size=intermediate_size,
            norm_topk_prob=True,
        )  # fmt: skip
    return LlamaConfig(**common, attention_bias=False, mlp_bias=False)


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 384,
    max_position_embeddings: int = 256,
    seed: int = 0,
    arch: str = "qwen2",
    tie_word_embeddings: bool = False,
    num_experts: int = 8,
    experts_per_token: int = 2,
) -> PreTrainedModel:
    """Build the default tiny causal LM, randomly initialised from ``seed``.

    Args:
        tokenizer: gives ``vocab_size = len(tokenizer)`` and the pad/bos/eos ids.
        hidden_size: the transformer's width (head_dim = hidden / heads).
        num_layers: decoder layers.
        num_heads: attention heads.
        num_kv_heads: key/value heads (grouped-query attention).
        intermediate_size: the MLP's inner size.
        max_position_embeddings: the longest sequence the model accepts.
        seed: weights are ``N(0, 0.02)`` draws from this seed (bit-identical per seed).
        arch: ``"qwen2"`` (q/k/v biases), ``"llama"`` (no biases) or ``"qwen3_moe"`` (q/k
            norms; each MLP ``num_experts`` experts, ``experts_per_token`` per token).
        tie_word_embeddings: share the input embedding with the LM head.

    Returns:
        A float32 ``Qwen2ForCausalLM`` / ``LlamaForCausalLM`` / ``Qwen3MoeForCausalLM`` in
        eval mode with sdpa attention; ``generation_config`` carries pad/bos and the stop
        ids.
    """
    config = tiny_config(
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        arch=arch,
        tie_word_embeddings=tie_word_embeddings,
        num_experts=num_experts,
        experts_per_token=experts_per_token,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation="sdpa"
        )
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=_stop_token_ids(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
    )
    return model.eval()

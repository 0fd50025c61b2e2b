"""A compact decode step for Llama-family decoders (Qwen2, Llama, Mistral): one new token per
row against the KV cache, in a few fused tensor ops per layer instead of the dozens of small
module calls a Hugging Face forward makes.

Notation: ``N`` rows, ``H`` hidden size, ``Hq`` / ``Hkv`` query / key-value heads (``G =
Hq / Hkv``), ``D`` head size, ``L`` cached positions, ``V`` vocabulary.

Per layer, for the rows' new token ``x`` (N, 1, H):

    h   = x + o_proj(attention(rope(q), rope(k), v))      q, k, v = qkv_proj(rmsnorm(x))
    out = h + down_proj(silu(gate) * up)                  gate, up = gate_up_proj(rmsnorm(h))

with ``qkv_proj`` and ``gate_up_proj`` the concatenated projection matrices (one matmul each),
``rope`` the rotary embedding at each row's position, and attention over the layer's cached
keys and values plus the new ones, masked to the row's real tokens:
``softmax(q kᵀ / sqrt(D) + mask) v`` with the ``G`` query heads of a key-value head in one
batched matmul. The math is the Hugging Face modules' (RMSNorm in float32 then cast back,
rotate-half RoPE, SiLU-gated MLP); the engine's tests hold its log-probs to a teacher-forced
forward within 1e-5 in float32.

Precision: matmuls run in the engine's compute dtype with the weights cast to it once per
weight update (:meth:`FastDecoder.refresh`), the residual stream and norms stay in the
parameters' dtype, as under ``torch.autocast``. Anything this does not reproduce exactly
(another architecture, RoPE scaling, sliding windows, a LoRA-wrapped module, biased MLPs)
is left to the Hugging Face forward (:func:`fast_decoder` returns None).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SUPPORTED = ("qwen2", "llama", "mistral")


def fast_decoder(model: nn.Module, compute_dtype: torch.dtype | None) -> FastDecoder | None:
    """A :class:`FastDecoder` for ``model``, or None when it is not a plain supported decoder."""
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED or inner is None:
        return None
    rope = getattr(config, "rope_scaling", None) or {}
    plain_rope = rope.get("rope_type", rope.get("type", "default")) == "default"
    windowed = getattr(config, "sliding_window", None) is not None and (
        getattr(config, "use_sliding_window", True) or config.model_type == "mistral"
    )
    layers = getattr(inner, "layers", None)
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if (
        any(kind != "full_attention" for kind in layer_types)
        or not plain_rope
        or windowed
        or getattr(config, "mlp_bias", False)
        or getattr(config, "hidden_act", "silu") != "silu"
        or layers is None
        or type(model).__name__
        not in ("Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")
    ):
        return None
    return FastDecoder(model, compute_dtype)


class FastDecoder:
    """The decode step of one model (module docstring); call :meth:`refresh` after its
    weights change."""

    def __init__(self, model: nn.Module, compute_dtype: torch.dtype | None) -> None:
        config = model.config
        self.model = model
        self.param_dtype = model.get_input_embeddings().weight.dtype
        self.compute_dtype = compute_dtype or self.param_dtype
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        rotary = model.model.rotary_emb
        self.inv_freq = rotary.inv_freq.float()  # (D / 2,)
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the fused projections from the model's current weights."""
        cast = self.compute_dtype

        def fused(*linears: nn.Linear) -> tuple[Tensor, Tensor | None]:
            weight = torch.cat([m.weight.detach() for m in linears]).to(cast)
            biases = [m.bias for m in linears]
            if all(b is None for b in biases):
                return weight, None
            bias = torch.cat(
                [b.detach() if b is not None else m.weight.new_zeros(m.out_features)
                 for m, b in zip(linears, biases)]
            )  # fmt: skip
            return weight, bias.to(cast)

        self.layers = []
        for layer in self.model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(
                {
                    "norm1": layer.input_layernorm.weight.detach(),
                    "qkv": fused(attn.q_proj, attn.k_proj, attn.v_proj),
                    "o": (attn.o_proj.weight.detach().to(cast), _bias(attn.o_proj, cast)),
                    "norm2": layer.post_attention_layernorm.weight.detach(),
                    "gate_up": fused(mlp.gate_proj, mlp.up_proj),
                    "down": (mlp.down_proj.weight.detach().to(cast), None),
                }
            )
        self.final_norm = self.model.model.norm.weight.detach()
        head = self.model.get_output_embeddings()
        self.head = (head.weight.detach().to(cast), _bias(head, cast))
        self.embed = self.model.get_input_embeddings().weight.detach()

    @torch.inference_mode()
    def step(self, tokens: Tensor, positions: Tensor, keys: Tensor, cache) -> Tensor:
        """Logits ``(N, V)`` after feeding ``tokens (N,)`` at ``positions (N,)``; appends their
        keys and values to ``cache`` (the engine's layers). ``keys`` (N, C) bool marks, over
        the cache's columns, the real tokens among the cached ones and the new one (False
        beyond it); attention runs over the filled columns only."""
        x = self.embed[tokens][:, None, :]  # (N, 1, H)
        cos, sin = self._rope(positions)  # (N, 1, 1, D)
        for weights, layer in zip(self.layers, cache.layers):
            h = _rms_norm(x, weights["norm1"], self.eps)
            x = x + self._attention(h, weights, layer, cos, sin, keys)
            h = _rms_norm(x, weights["norm2"], self.eps)
            gate, up = _linear(h, *weights["gate_up"]).chunk(2, dim=-1)
            x = x + _linear(F.silu(gate) * up, *weights["down"])
        x = _rms_norm(x, self.final_norm, self.eps)
        return _linear(x, *self.head)[:, -1, :]  # (N, V)

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        freqs = positions[:, None].float() * self.inv_freq.to(positions.device)  # (N, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.rope_scale, emb.sin() * self.rope_scale
        dtype = self.param_dtype
        return cos.to(dtype)[:, None, None, :], sin.to(dtype)[:, None, None, :]

    def _attention(self, h, weights, layer, cos, sin, keys) -> Tensor:
        n, d = h.shape[0], self.head_dim
        qkv = _linear(h, *weights["qkv"])  # (N, 1, (Hq + 2 Hkv) D)
        q, k, v = qkv.split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        q = q.view(n, 1, self.heads, d).transpose(1, 2)  # (N, Hq, 1, D)
        k = k.view(n, 1, self.kv_heads, d).transpose(1, 2)  # (N, Hkv, 1, D)
        v = v.view(n, 1, self.kv_heads, d).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        key_cache, value_cache = layer.update(k, v)  # (N, Hkv, L + 1, D) each: the filled part
        keys = keys[:, : key_cache.shape[-2]]  # (N, L + 1)
        group = self.heads // self.kv_heads
        q = q.reshape(n, self.kv_heads, group, d).to(self.compute_dtype)  # (N, Hkv, G, D)
        scores = torch.matmul(q, key_cache.to(self.compute_dtype).transpose(-1, -2))
        scores = scores.float() / math.sqrt(d)  # (N, Hkv, G, L + 1)
        scores = scores.masked_fill(~keys[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(self.compute_dtype)
        out = torch.matmul(probs, value_cache.to(self.compute_dtype))  # (N, Hkv, G, D)
        out = out.reshape(n, 1, self.heads * d)
        return _linear(out, *weights["o"])


def _bias(linear: nn.Linear, dtype: torch.dtype) -> Tensor | None:
    return None if linear.bias is None else linear.bias.detach().to(dtype)


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x Wᵀ + b`` in the weight's dtype (the compute dtype)."""
    return F.linear(x.to(weight.dtype), weight, bias)


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Hugging Face's RMSNorm: normalise in float32, cast back, scale."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x cos + rotate_half(x) sin`` (rotate-half RoPE)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin

"""A compact decode step for Llama-family decoders (Qwen2, Qwen3, Llama, Mistral) and their
mixtures of experts (Qwen3-MoE, Qwen2-MoE, Mixtral): one new token per row against the KV
cache, in a few fused tensor ops per layer instead of the dozens of small module calls a
Hugging Face forward makes.

Notation: ``N`` rows, ``H`` hidden size, ``Hq`` / ``Hkv`` query / key-value heads (``G =
Hq / Hkv``), ``D`` head size, ``L`` cached positions, ``V`` vocabulary.

Per layer, for the rows' new token ``x`` (N, 1, H):

    h   = x + o_proj(attention(rope(q), rope(k), v))      q, k, v = qkv_proj(rmsnorm(x))
    out = h + down_proj(silu(gate) * up)                  gate, up = gate_up_proj(rmsnorm(h))

with ``qkv_proj`` and ``gate_up_proj`` the concatenated projection matrices (one matmul each)
— or, where the layer's feed-forward is a mixture of experts, that block's router, then the
experts (:mod:`ardea.rollout.engines.inprocess.fast_experts`), then its shared experts —
``rope`` the rotary embedding at each row's position (the model's own frequencies and
scale: Llama 3's and YaRN's included; Qwen3: after an RMSNorm of each query
and key head over its ``D`` features, ``q_norm`` / ``k_norm``), and attention over the layer's cached
keys and values plus the new ones, masked to the row's real tokens:
``softmax(q kᵀ / sqrt(D) + mask) v`` with the ``G`` query heads of a key-value head in one
batched matmul. The math is the Hugging Face modules' (RMSNorm in float32 then cast back,
rotate-half RoPE, SiLU-gated MLP); the engine's tests hold its log-probs to a teacher-forced
forward within 1e-5 in float32.

Precision: matmuls run in the engine's compute dtype with the weights cast to it and laid
out for the CPU's matmul library once per weight update (:meth:`FastDecoder.refresh`,
:class:`ardea.model.packed_linear.PackedLinear`), the residual stream, norms and RoPE stay in
the parameters' dtype and attention scores are scaled in the compute dtype and masked and
normalised in float32, as under ``torch.autocast`` with the eager attention. RoPE rotates the
query and key heads in one pass, viewing each head as two halves: ``x cos + swap(x) (−sin,
+sin)`` (``swap`` exchanging the halves) is ``x cos + rotate_half(x) sin`` term for term. Anything this does not reproduce exactly
(another architecture, RoPE frequencies that change with the length (dynamic NTK,
LongRoPE), sliding windows, a LoRA-wrapped module, biased MLPs,
experts other than transformers' default grouped ones) is left to the Hugging Face forward
(:func:`fast_decoder` returns None).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ardea.model.packed_linear import PackedLinear
from ardea.model.routing_replay import routes_dtype
from ardea.rollout.engines.inprocess.fast_experts import RoutedExperts, fits

SUPPORTED = ("qwen2", "qwen3", "llama", "mistral", "qwen3_moe", "qwen2_moe", "mixtral")
STATIC_ROPE = ("default", "linear", "llama3", "yarn")
CLASSES = (
    "Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM",
    "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM",
)  # fmt: skip


def fast_decoder(model: nn.Module, compute_dtype: torch.dtype | None) -> FastDecoder | None:
    """A :class:`FastDecoder` for ``model``, or None when it is not a plain supported decoder."""
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED or inner is None:
        return None
    rope = getattr(config, "rope_scaling", None) or {}
    # frequencies fixed at load (Llama 3's, YaRN's, linear scaling): the step reads them
    # from the model; dynamic NTK and LongRoPE change them with the sequence length
    static_rope = rope.get("rope_type", rope.get("type", "default")) in STATIC_ROPE
    windowed = getattr(config, "sliding_window", None) is not None and (
        getattr(config, "use_sliding_window", True) or config.model_type == "mistral"
    )
    layers = getattr(inner, "layers", None)
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if (
        any(kind != "full_attention" for kind in layer_types)
        or not static_rope
        or windowed
        or getattr(config, "mlp_bias", False)
        or getattr(config, "hidden_act", "silu") != "silu"
        or layers is None
        or type(model).__name__ not in CLASSES
        or not all(fits(layer.mlp) for layer in layers)
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
        self.scaling = self.head_dim**-0.5
        rotary = model.model.rotary_emb
        self.inv_freq = rotary.inv_freq.float()  # (D / 2,)
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the fused projections from the model's current weights."""
        cast = self.compute_dtype

        def fused(*linears: nn.Linear) -> PackedLinear:
            weight = torch.cat([m.weight.detach() for m in linears]).to(cast)
            biases = [m.bias for m in linears]
            if all(b is None for b in biases):
                return PackedLinear(weight)
            bias = torch.cat(
                [b.detach() if b is not None else m.weight.new_zeros(m.out_features)
                 for m, b in zip(linears, biases)]
            )  # fmt: skip
            return PackedLinear(weight, bias.to(cast))

        self.layers = []
        for layer in self.model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            weights = {
                "norm1": layer.input_layernorm.weight.detach(),
                "qkv": fused(attn.q_proj, attn.k_proj, attn.v_proj),
                "o": fused(attn.o_proj),
                "norm2": layer.post_attention_layernorm.weight.detach(),
            }
            if hasattr(mlp, "experts"):
                weights["experts"] = RoutedExperts(mlp, cast)
            else:
                weights["gate_up"] = fused(mlp.gate_proj, mlp.up_proj)
                weights["down"] = fused(mlp.down_proj)
            if getattr(attn, "q_norm", None) is not None:  # Qwen3: per-head query/key norms
                weights["q_norm"] = attn.q_norm.weight.detach()
                weights["k_norm"] = attn.k_norm.weight.detach()
            self.layers.append(weights)
        self.final_norm = self.model.model.norm.weight.detach()
        self.head = fused(self.model.get_output_embeddings())
        self.embed = self.model.get_input_embeddings().weight.detach()

    @torch.inference_mode()
    def step(
        self, tokens: Tensor, positions: Tensor, keys: Tensor, cache, record: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Logits ``(N, V)`` after feeding ``tokens (N,)`` at ``positions (N,)``; appends their
        keys and values to ``cache`` (the engine's layers). ``keys`` (N, C) bool marks, over
        the cache's columns, the real tokens among the cached ones and the new one (False
        beyond it). With ``record``, also the experts each MoE layer routed the tokens to
        ``(N, L, K)`` (:mod:`ardea.model.routing_replay`'s layout), else None."""
        logits = self._step(tokens, positions, keys, cache)
        if not record:
            return logits, None
        blocks = [w["experts"] for w in self.layers if "experts" in w]
        if not blocks:
            raise ValueError("recording routed experts needs a mixture-of-experts model")
        routes = torch.stack([b.chosen for b in blocks], dim=1)  # (N, L, K)
        return logits, routes.to(routes_dtype(blocks[0].count))

    def _step(self, tokens: Tensor, positions: Tensor, keys: Tensor, cache) -> Tensor:
        x = F.embedding(tokens, self.embed)[:, None, :]  # (N, 1, H)
        cos, sin = self._rope(positions)  # (N, 1, 1, D/2), (N, 1, 2, D/2)
        # (N, 1, 1, C): 0 on the keys attended, -inf elsewhere, added to every layer's scores
        mask = torch.zeros(keys.shape, dtype=torch.float32, device=keys.device)
        mask = mask.masked_fill_(~keys, float("-inf"))[:, None, None, :]
        for weights, layer in zip(self.layers, cache.layers):
            h = _rms_norm(x, weights["norm1"], self.eps)
            x = x + self._attention(h, weights, layer, cos, sin, mask)
            h = _rms_norm(x, weights["norm2"], self.eps)
            if "experts" in weights:
                x = x + weights["experts"](h)
                continue
            gate, up = weights["gate_up"](h).chunk(2, dim=-1)
            x = x + weights["down"](F.silu(gate) * up)
        x = _rms_norm(x, self.final_norm, self.eps)
        return self.head(x)[:, -1, :]  # (N, V)

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The rotary factors at ``positions (N,)`` for heads viewed as two halves ``(N, H,
        2, D/2)``: ``cos`` (N, 1, 1, D/2) for both halves and ``sin`` (N, 1, 2, D/2) signed
        ``(−sin, +sin)``, so that ``x cos + swap_halves(x) sin`` is rotate-half RoPE."""
        freqs = positions[:, None].float() * self.inv_freq.to(positions.device)  # (N, D/2)
        cos, sin = freqs.cos(), freqs.sin()
        if self.rope_scale != 1.0:
            cos, sin = cos * self.rope_scale, sin * self.rope_scale
        signed = torch.stack((-sin, sin), dim=1)  # (N, 2, D/2)
        dtype = self.param_dtype
        return cos.to(dtype)[:, None, None, :], signed.to(dtype)[:, None, :, :]

    def _attention(self, h, weights, layer, cos, sin, mask) -> Tensor:
        n, d, heads, kv_heads = h.shape[0], self.head_dim, self.heads, self.kv_heads
        qkv = weights["qkv"](h).view(n, heads + 2 * kv_heads, 2, d // 2)  # (N, Hq+2Hkv, 2, D/2)
        qk = qkv[:, : heads + kv_heads]  # (N, Hq + Hkv, 2, D/2), queries and keys
        if "q_norm" in weights:  # each head normalised over its D features, then rotated
            q = _rms_norm(qk[:, :heads].reshape(n, heads, d), weights["q_norm"], self.eps)
            k = _rms_norm(qk[:, heads:].reshape(n, kv_heads, d), weights["k_norm"], self.eps)
            qk = torch.cat([q, k], dim=1).view(n, heads + kv_heads, 2, d // 2)
        qk = rotate(qk, cos, sin)
        k = qk[:, heads:].reshape(n, kv_heads, 1, d)
        v = qkv[:, heads + kv_heads :].reshape(n, kv_heads, 1, d)
        compute = self.compute_dtype
        key_cache, value_cache = _columns(layer, k, v, compute)  # (N, Hkv, C', D) each
        # batched over the N·Hkv key-value heads as 3-D products: torch.matmul's 4-D path
        # runs these tiny products up to 1.7x slower in bf16 (256 rows of 8 heads)
        group, columns = heads // kv_heads, key_cache.shape[-2]
        # cast first: the cast makes the strided slice contiguous, so the reshape is a view
        q = qk[:, :heads].to(compute).reshape(n * kv_heads, group, d)  # (N·Hkv, G, D)
        keys = key_cache.reshape(n * kv_heads, columns, d)
        scores = torch.bmm(q, keys.transpose(1, 2)).view(n, kv_heads, group, columns)
        # scaled in the compute dtype and masked in float32, as the eager attention does
        scores = scores * self.scaling + mask[..., :columns]  # (N, Hkv, G, C')
        probs = torch.softmax(scores, dim=-1).to(compute).view(n * kv_heads, group, columns)
        out = torch.bmm(probs, value_cache.reshape(n * kv_heads, columns, d))  # (N·Hkv, G, D)
        return weights["o"](out.view(n, 1, heads * d))


def rotate(heads: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE, ``x cos + rotate_half(x) sin``, on heads viewed as two halves
    ``(N, H, 2, D/2)`` with :meth:`FastDecoder._rope`'s factors: rolling the two halves by
    one swaps them (as ``flip``, in half its time at a decode step's shapes) and the signed
    ``sin`` negates the first, term for term the same products and sum."""
    return heads * cos + heads.roll(1, 2) * sin


def _columns(layer, k: Tensor, v: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Append the new keys and values ``(N, Hkv, 1, D)`` to ``layer``; the keys and values to
    attend over, in ``dtype``: a preallocated layer's whole buffers ``(N, Hkv, C, D)`` (kept
    in the compute dtype; the columns beyond the new one are zeros, masked out, and
    multiplying by them adds exact zeros), which are contiguous, where the growing view of
    the filled columns is not and a CPU ``bmm`` in bf16 copies it at every call; any other
    layer's filled columns."""
    keys, values = layer.update(k, v)
    buffers = getattr(layer, "key_buffer", None), getattr(layer, "value_buffer", None)
    if buffers[0] is not None and buffers[0].dtype == dtype:
        return buffers
    return keys.to(dtype), values.to(dtype)


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Hugging Face's RMSNorm: normalise in float32, cast back, scale. For float32 inputs
    ``F.rms_norm`` computes exactly that in fewer kernels (bit-equal, tested); for others it
    scales before casting back, so the steps are spelt out."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)

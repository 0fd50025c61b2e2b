"""Mixture-of-experts feed-forwards on the compact decode step (Qwen3-MoE, Qwen2-MoE, Mixtral).

Notation: ``N`` rows (one new token each), ``H`` hidden size, ``E`` experts of intermediate
size ``I``, ``K`` experts per token, ``C`` the most rows any one expert gets.

The block's own router chooses each row's experts ``ids (N, K)`` and weights ``w (N, K)``
(Qwen's and Mixtral's softmax top-k, renormalised where the family does), called as the
module it is, under the engine's autocast as in the trainer's forward. The experts then run
as two batched matmuls over a padded buffer, the rows sent to expert ``e`` in its first
``c_e`` slots of ``(E, C, H)``:

    out_n = Σ_k w_nk · down_e(silu(gate_e(x_n)) · up_e(x_n)),   e = ids_nk

in the dtype the model's experts implementation computes them in, with the weights cast to
it once per weight update: the compute dtype under ardea's
(:mod:`ardea.model.autocast_experts`, which the engine switches its model to), the
parameters' dtype under transformers' own grouped experts (which autocast does not reach),
so the step does the trainer's arithmetic either way. Shared experts (Qwen2-MoE: ``sigmoid(shared_expert_gate(x)) ·
shared_expert(x)``) are the block's own modules. One batched matmul per projection instead of
one per expert: at a decode step each expert gets a few rows, and the per-call cost of eight
small matmuls outweighs the padding (``benchmarks/README.md``, "Mixtures of experts on the
compact step").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ardea.model.autocast_experts import NAME as AUTOCAST

#: the blocks whose forward is exactly router → experts (→ + shared experts)
BLOCKS = ("Qwen3MoeSparseMoeBlock", "Qwen2MoeSparseMoeBlock", "MixtralSparseMoeBlock")


def fits(mlp: nn.Module) -> bool:
    """Whether the step computes ``mlp`` exactly: a plain SiLU-gated MLP, or one of
    :data:`BLOCKS` with grouped experts (transformers' or ardea's; gated, concatenated
    ``[gate; up]`` rows, no biases)."""
    if type(mlp).__name__ not in BLOCKS:
        return all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj"))
    experts = mlp.experts
    return (
        getattr(experts.config, "_experts_implementation", None) in ("grouped_mm", AUTOCAST)
        and experts.has_gate
        and experts.is_concatenated
        and not (experts.has_bias or experts.is_transposed or experts.has_post_expert_norm)
        and experts.gate_up_proj.dim() == 3
        and getattr(experts.config, "hidden_act", None) == "silu"
    )


class RoutedExperts:
    """One MoE block on the decode step (module docstring); ``chosen`` holds the experts
    ``(N, K)`` of the last call."""

    def __init__(self, block: nn.Module, compute_dtype: torch.dtype) -> None:
        self.block = block
        experts = block.experts
        self.count = experts.gate_up_proj.shape[0]
        own = experts.gate_up_proj.dtype
        cast = compute_dtype if experts.config._experts_implementation == AUTOCAST else own
        self.gate_up = self.down = None
        if cast != own:
            # (E, H, 2I) and (E, I, H) in the compute dtype, contiguous copies (bmm on the
            # transposed views measured several times slower), rebuilt at every weight update
            self.gate_up = experts.gate_up_proj.detach().transpose(1, 2).to(cast).contiguous()
            self.down = experts.down_proj.detach().transpose(1, 2).to(cast).contiguous()
        self.chosen: Tensor | None = None

    def __call__(self, h: Tensor) -> Tensor:
        """``h (N, 1, H)`` → the block's output ``(N, 1, H)`` in ``h``'s dtype."""
        n, hidden = h.shape[0], h.shape[-1]
        x = h.view(n, hidden)
        _, weights, ids = self.block.gate(x)  # (N, K) each
        self.chosen = ids
        if self.gate_up is None:  # no cast needed: the block's own experts, as the trainer's
            out = self.block.experts(x, ids, weights)
        else:  # in the weights cast above; autocast would cast them again at every call
            with torch.autocast(x.device.type, enabled=False):
                out = self._experts(x.to(self.gate_up.dtype), ids, weights).to(x.dtype)
        shared = getattr(self.block, "shared_expert", None)
        if shared is not None:
            gate = self.block.shared_expert_gate(x)
            out = out + F.sigmoid(gate) * shared(x)
        return out.view(n, 1, hidden)

    def _experts(self, x: Tensor, ids: Tensor, weights: Tensor) -> Tensor:
        """``Σ_k w_nk expert_{ids_nk}(x_n)`` ``(N, H)``, as transformers' grouped experts
        compute it: each expert's output times its weight in their promoted dtype (bf16
        under Qwen's bf16 router weights, float32 under Mixtral's), summed over ``k``."""
        n, top_k = ids.shape
        flat = ids.reshape(-1)  # (N·K,) in (row, k) order
        # each pair's slot among its expert's rows: how many pairs before it chose the expert
        chose = F.one_hot(flat, self.count)  # (N·K, E)
        slot = (chose.cumsum(0) - 1).gather(1, flat[:, None]).squeeze(1)  # (N·K,)
        capacity = int(chose.sum(0).max())
        padded = x.new_zeros(self.count, capacity, x.shape[-1])  # (E, C, H)
        padded[flat, slot] = x[:, None, :].expand(n, top_k, -1).reshape(n * top_k, -1)
        gate, up = torch.bmm(padded, self.gate_up).chunk(2, dim=-1)  # (E, C, I) each
        y = torch.bmm(F.silu(gate) * up, self.down)[flat, slot]  # (N·K, H)
        return (y.view(n, top_k, -1) * weights[..., None]).sum(dim=1)

"""Mixture-of-experts models (Qwen2-MoE, Qwen3-MoE, Mixtral, ...).

:func:`moe_routing` tells whether a model routes tokens to experts; its backbone then also
returns per-layer router logits, and :func:`load_balancing_loss` turns them into the
family's own auxiliary load-balancing loss (Switch Transformer, Fedus et al. 2021, eqs.
4-6, as ``transformers`` implements it with top-k counts).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from torch import Tensor, nn
from transformers.models.mixtral.modeling_mixtral import (
    load_balancing_loss_func as _mixtral_load_balancing_loss,
)

from ardea.model.unwrap import unwrap_peft


def moe_routing(model: nn.Module) -> tuple[int, int] | None:
    """``(num_experts E, top_k K)`` of a Hugging Face MoE causal LM, else ``None``.

    A model is MoE when its config has ``output_router_logits`` and a positive expert count
    (``num_experts`` as in Qwen2/3-MoE, or ``num_local_experts`` as in Mixtral) and
    ``num_experts_per_tok``.
    """
    config = getattr(unwrap_peft(model), "config", None)
    if config is None or not hasattr(config, "output_router_logits"):
        return None
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    if not experts or not top_k:
        return None
    return int(experts), int(top_k)


def load_balancing_loss(
    model: nn.Module, router_logits: Sequence[Tensor], attention_mask: Tensor | None = None
) -> Tensor:
    """The model family's load-balancing loss of one forward pass (a 0-d tensor).

    ``aux = E * sum_e f_e * P_e`` where, over the tokens counted by ``attention_mask`` (all
    tokens when ``None``) and all layers, ``f_e`` is the fraction of top-k assignments that
    go to expert ``e`` and ``P_e`` the mean router probability of ``e``; 1 when balanced.

    Args:
        model: an MoE model (see :func:`moe_routing`).
        router_logits: one ``(N * S, E)`` tensor per MoE layer, as the backbone returns them.
        attention_mask: ``(N, S)``, 1 = real token.
    """
    routing = moe_routing(model)
    if routing is None:
        raise ValueError(f"{type(model).__name__} is not a mixture-of-experts model")
    family = sys.modules.get(type(unwrap_peft(model)).__module__)
    loss_fn = getattr(family, "load_balancing_loss_func", _mixtral_load_balancing_loss)
    experts, top_k = routing
    return loss_fn(tuple(router_logits), experts, top_k, attention_mask)


def moe_forward_kwargs(model: nn.Module) -> dict[str, bool]:
    """What a forward of ``model`` needs to return its router logits (MoE models only)."""
    return {"output_router_logits": True} if moe_routing(model) is not None else {}


def moe_outputs(
    model: nn.Module, outputs: object, attention_mask: Tensor | None
) -> tuple[Tensor | None, tuple[Tensor, ...] | None]:
    """``(aux_loss, router_logits)`` of a forward run with :func:`moe_forward_kwargs`
    (``(None, None)`` for a dense model)."""
    router = getattr(outputs, "router_logits", None)
    if not router:
        return None, None
    router = tuple(router)
    return load_balancing_loss(model, router, attention_mask), router

"""Run a Hugging Face causal LM's backbone: find it, give it positions, get hidden states.

A causal LM is ``logits = lm_head(backbone(input_ids).last_hidden_state)`` for most
families. :func:`split_causal_lm` returns ``(backbone, lm_head)`` only for model types whose
``ForCausalLM.forward`` is known to be exactly that (:data:`PLAIN_HEAD_MODEL_TYPES`); others
(Gemma 2/3's final logit soft-capping, Cohere's ``logit_scale``, Granite's
``logits_scaling``, unknown families) get ``None`` and callers fall back to the full
forward. Add a family here only after checking its ``ForCausalLM.forward`` and covering it
in ``tests/model/test_logprobs.py``.

Positions: when an attention mask is given and no position ids, rows are numbered from
their first attended token, ``position_ids = clamp(cumsum(attention_mask) - 1, min=0)``,
as ``transformers.generate`` does. A left-padded row then gives the same outputs on its
tokens as the unpadded row; for right padding this equals ``arange(S)`` on real tokens.

Mixture-of-experts models: :mod:`ardea.model.moe`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from ardea.model.flops import count_forward
from ardea.model.unwrap import unwrap_peft

PLAIN_HEAD_MODEL_TYPES = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "olmo",
        "olmo2",
        "phi3",
        "smollm3",
        "starcoder2",
    }
)


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions counted over attended tokens.

    ``position_ids[n, t] = max(0, sum_{u <= t} attention_mask[n, u] - 1)``.

    Args:
        attention_mask: ``(N, S)`` 0/1 or bool, 1 = real token.

    Returns:
        ``(N, S)`` int64 position ids.
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def resolve_position_ids(
    attention_mask: Tensor | None, position_ids: Tensor | None
) -> Tensor | None:
    """Explicit ``position_ids`` win; else derive them from ``attention_mask`` if given."""
    if position_ids is not None or attention_mask is None:
        return position_ids
    return position_ids_from_mask(attention_mask)


def get_backbone(model: nn.Module) -> nn.Module:
    """The base model of a HF causal LM (``model.model`` for Qwen2/Llama), found through
    ``base_model_prefix``; raises ``ValueError`` for a model without one. A ``peft``
    wrapper is looked through: its adapters live inside the wrapped model's modules."""
    model = unwrap_peft(model)
    prefix = getattr(model, "base_model_prefix", "")
    backbone = getattr(model, prefix, None) if prefix else None
    if not isinstance(backbone, nn.Module) or backbone is model:
        raise ValueError(f"cannot find the backbone of {type(model).__name__} (base_model_prefix)")
    return backbone


def split_causal_lm(model: nn.Module) -> tuple[nn.Module, nn.Linear] | None:
    """``(backbone, lm_head)`` when ``logits == lm_head(backbone(...).last_hidden_state)``
    is known to hold for this model family, else ``None`` (use the full forward). A model
    wrapped for data parallelism (DDP, FSDP2) always takes the full forward: its hooks
    (gradient all-reduce, gathering shards) run on the wrapper's own forward only."""
    if isinstance(model, DistributedDataParallel | FSDPModule):
        return None
    model = unwrap_peft(model)
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, nn.Linear):
        return None
    try:
        return get_backbone(model), head
    except ValueError:
        return None


def last_hidden_states(
    backbone: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
) -> Tensor:
    """Final (post-norm) hidden states of a HF base model, without a KV cache.

    Args:
        input_ids: ``(N, S)`` token ids.
        attention_mask: ``(N, S)``, 1 = real token; positions derived from it when
            ``position_ids`` is ``None`` (see module docstring).
        position_ids: ``(N, S)`` explicit positions (e.g. packed sequences).

    Returns:
        ``(N, S, H)`` hidden states in the backbone's dtype.
    """
    return backbone_forward(backbone, input_ids, attention_mask, position_ids).last_hidden_state


def backbone_forward(
    backbone: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
    **kwargs: Any,
) -> Any:
    """The backbone's output object (``last_hidden_state`` ``(N, S, H)``, and
    ``router_logits`` when ``output_router_logits=True`` is passed to an MoE backbone);
    arguments as in :func:`last_hidden_states`, ``kwargs`` go to the backbone."""
    count_forward(backbone, input_ids, attention_mask)
    return backbone(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=resolve_position_ids(attention_mask, position_ids),
        use_cache=False,
        **kwargs,
    )


def check_input_ids(input_ids: Tensor, who: str) -> None:
    """Raise ``ValueError`` unless ``input_ids`` is a 2-D ``(N, S)`` integer tensor."""
    if input_ids.dim() != 2:
        raise ValueError(f"{who} input_ids must be 2-D (N, S), got shape {tuple(input_ids.shape)}")
    if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise ValueError(f"{who} input_ids must be integer token ids, got {input_ids.dtype}")

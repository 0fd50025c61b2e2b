"""Mixture-of-experts matmuls in the compute dtype, as every other matmul of a forward.

transformers' default experts (``experts_implementation="grouped_mm"``) cast their input to
the expert weights' dtype before a grouped matmul that ``torch.autocast`` does not reach, so
under bfloat16 autocast with float32 parameters a model's attention and dense layers ran in
bf16 and its experts in float32: ``model.compute_dtype`` silently did not apply to most of an
MoE model's weights (and auto's choice of bf16, made by timing bf16 matmuls, did not speed
them up). :data:`NAME` is that implementation with the weights (and biases) cast to the
autocast dtype first — the cast autocast makes for every ``nn.Linear``, differentiable, so
the float32 parameters still get their gradients — and exactly transformers' otherwise.
The in-process engine keeps the cast weights between decode steps (:func:`keep_casts`, a
copy of the experts in the compute dtype) and drops them when its weights are updated
(:func:`forget_casts`), so that decoding does not cast every expert at every step.

:func:`follow_autocast` switches a model's grouped experts to it; the trainer's forwards
(:meth:`ardea.model.Precision.forward`) and the in-process engine do it for the models they
run, so the behaviour log-probs and the trainer's come from the same arithmetic. A model
saved afterwards carries no trace of it (transformers does not save the implementation).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch import Tensor, nn
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, grouped_mm_experts_forward

NAME = "ardea_autocast_grouped_mm"
_CAST = ("gate_up_proj", "up_proj", "down_proj", "gate_up_proj_bias", "up_proj_bias",
         "down_proj_bias")  # fmt: skip
_SWITCHED = "_ardea_experts_follow_autocast"
_CACHE = "_ardea_cast_weights"  # on an experts module: name -> (stamp, cast weight)
_local = threading.local()  # .keep: whether this thread's forwards keep their casts


class _CastWeights:
    """``experts`` seen with its weight tensors in ``dtype`` (everything else its own)."""

    def __init__(self, experts: nn.Module, dtype: torch.dtype) -> None:
        self._experts, self._dtype = experts, dtype

    def __getattr__(self, name: str):
        value = getattr(self._experts, name)
        if name in _CAST and isinstance(value, Tensor) and value.is_floating_point():
            return _cast(self._experts, name, value, self._dtype)
        return value


def _cast(experts: nn.Module, name: str, weight: Tensor, dtype: torch.dtype) -> Tensor:
    """``weight`` in ``dtype``: cast anew at every forward, except within
    :func:`keep_casts` (without gradients), where the cast is kept on ``experts`` until
    :func:`forget_casts`."""
    if torch.is_grad_enabled() or not getattr(_local, "keep", False):
        return weight.to(dtype)
    cache = experts.__dict__.setdefault(_CACHE, {})
    stamp = (weight.data_ptr(), dtype)
    kept = cache.get(name)
    if kept is None or kept[0] != stamp:
        kept = cache[name] = (stamp, weight.detach().to(dtype))
    return kept[1]


@contextlib.contextmanager
def keep_casts() -> Iterator[None]:
    """Within the context, this thread's forwards keep the experts' cast weights between
    calls (a decode step then casts none); the caller calls :func:`forget_casts` whenever
    the weights change. Not automatic: an optimizer step need not tell (torch's fused AdamW
    updates the parameters without bumping their version counters)."""
    before = getattr(_local, "keep", False)
    _local.keep = True
    try:
        yield
    finally:
        _local.keep = before


def forget_casts(model: nn.Module) -> None:
    """Drop the cast weights :func:`keep_casts` kept on ``model``'s experts."""
    for module in model.modules():
        module.__dict__.pop(_CACHE, None)


def autocast_grouped_mm(
    experts: nn.Module, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor
) -> Tensor:
    """transformers' grouped experts forward, its weights cast to the autocast dtype when
    autocast is on for their device (``hidden_states (T, H)`` → ``(T, H)``)."""
    device = hidden_states.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        weight = getattr(experts, "gate_up_proj", None)
        if weight is None:
            weight = experts.up_proj
        if weight.dtype != dtype:
            experts = _CastWeights(experts, dtype)
    return grouped_mm_experts_forward(experts, hidden_states, top_k_index, top_k_weights)


ALL_EXPERTS_FUNCTIONS.register(NAME, autocast_grouped_mm)


def follow_autocast(model: nn.Module) -> None:
    """Switch ``model``'s grouped experts (if any) to :data:`NAME`; cheap after the first
    call (the model remembers it)."""
    if getattr(model, _SWITCHED, False):
        return
    for module in model.modules():
        config = getattr(module, "config", None)
        if (hasattr(module, "gate_up_proj") or hasattr(module, "up_proj")) and getattr(
            config, "_experts_implementation", None
        ) == "grouped_mm":
            config._experts_implementation = NAME
    setattr(model, _SWITCHED, True)

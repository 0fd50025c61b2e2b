"""Routing replay (R3) for mixture-of-experts models: record which experts the router chose
for every token of a forward, and make a later forward choose the same ones.

Notation: ``T`` tokens of a forward (``N * S``: the router sees ``(N, S, H)`` flattened), ``L``
MoE layers (blocks with experts, in model order: dense layers are not counted), ``K``
experts per token, ``E`` experts.

Why. In RL the experts a token was routed to when it was sampled (the engine's forward) and
when it is trained (the trainer's) differ: bf16 rounding, a different batch, weights a step
older. A token whose experts changed gets a different log-prob for that reason alone, a
large share of an MoE model's train–inference mismatch. Replaying the rollout's routing in
the training forwards removes it while the router still trains: the gate weights are the
trainer's router's own at the replayed experts.

How, for every family alike. Each family's MoE block chooses its experts with one
``topk`` over a ``(T, E)`` tensor of router scores with ``k = K`` (Qwen2/3-MoE, Mixtral,
OLMoE: softmax probabilities; gpt-oss: logits; DeepSeek-V3, GLM-4-MoE: bias-corrected
sigmoid scores after group selection) and computes the gate weights from the chosen ids. A
torch function mode active during the block's forward (forward hooks on the block) sees that
call: recording keeps its indices; replaying returns the recorded ids where they are given
(``>= 0``) and the block's own choice elsewhere, with the values gathered at those ids, so
the family's own code computes the gate weights from them (renormalisation, softmax over
the chosen, scaling factors included). Calls with other shapes (DeepSeek's group scores)
pass through. Only the calling thread is affected (modes and the state are thread-local),
so an engine generating in a background thread on the same module is not.

Layout: ``routes (T, L, K)`` (or ``(N, S, L, K)``) integer expert ids, ``-1`` = not
recorded (the block routes that token itself).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ardea.model.moe import moe_routing
from ardea.model.unwrap import unwrap_peft

__all__ = ["RoutingRecord", "moe_blocks", "record_routing", "replay_routing", "routes_dtype"]

_LAYER = "_ardea_routing_layer"  # attribute on each tapped block: its MoE layer index
_LAYOUT = "_ardea_routing_layout"  # attribute on a tapped model: (L, K, E)
_local = threading.local()  # .state: the RoutingRecord of this thread's forward, or None


def moe_blocks(model: nn.Module) -> list[nn.Module]:
    """The MoE blocks of ``model`` in model order: modules with an ``experts`` child and a
    router child (``gate`` as Qwen, Mixtral and DeepSeek name it, or ``router`` as gpt-oss)."""
    return [
        module
        for module in model.modules()
        if isinstance(getattr(module, "experts", None), nn.Module)
        and isinstance(getattr(module, "gate", None) or getattr(module, "router", None), nn.Module)
    ]


def routes_dtype(experts: int) -> torch.dtype:
    """The smallest signed integer dtype that holds expert ids ``0 .. experts - 1`` and -1."""
    return torch.int8 if experts <= 127 else torch.int16 if experts <= 32767 else torch.int32


class RoutingRecord:
    """The experts each MoE layer chose in one forward (``chosen[l]``: ``(T, K)`` long), and
    the routes that forward replays (``replay``: ``(T, L, K)``, or None when recording)."""

    def __init__(self, layers: int, top_k: int, experts: int, replay: Tensor | None) -> None:
        self.layers, self.top_k, self.experts = layers, top_k, experts
        self.replay = replay
        self.chosen: list[Tensor | None] = [None] * layers
        self.replayed: list[Tensor] = []  # per layer: (T,) bool, a token given experts
        self.changed: list[Tensor] = []  # per layer: (T,) bool, given experts not the own

    def changed_fraction(self) -> Tensor | None:
        """Of the replayed (token, layer) choices, the fraction whose replayed experts differ
        (as a set) from the ones the router chose itself (0-d float); None if none."""
        if not self.replayed:
            return None
        replayed = torch.cat(self.replayed).sum()
        return torch.cat(self.changed).sum() / replayed.clamp(min=1)

    def routes(self) -> Tensor:
        """``(T, L, K)`` the chosen expert ids of every layer (in :func:`routes_dtype`)."""
        missing = [layer for layer, ids in enumerate(self.chosen) if ids is None]
        if missing:
            raise RuntimeError(f"MoE layers {missing} chose no experts in the recorded forward")
        return torch.stack(self.chosen, dim=1).to(routes_dtype(self.experts))


class _TopKMode(TorchFunctionMode):
    """Within one MoE block's forward: record (and, replaying, replace) the expert choice."""

    def __init__(self, record: RoutingRecord, layer: int) -> None:
        super().__init__()
        self.record, self.layer = record, layer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch.topk and func is not Tensor.topk:
            return func(*args, **kwargs)
        scores = args[0]
        k = args[1] if len(args) > 1 else kwargs.get("k")
        dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
        record = self.record
        choice = scores.dim() == 2 and dim in (-1, 1) and k == record.top_k
        if not choice or scores.shape[-1] != record.experts:
            return func(*args, **kwargs)
        result = func(*args, **kwargs)
        ids = result.indices
        if record.replay is not None:
            given = record.replay[:, self.layer]  # (T, K)
            if given.shape != ids.shape:
                raise ValueError(
                    f"routing replay: MoE layer {self.layer} routes {tuple(ids.shape)} "
                    f"(tokens, experts per token) but the replayed routes give "
                    f"{tuple(given.shape)}"
                )
            given = given.to(ids.device, torch.long)
            replayed = (given >= 0).all(dim=-1)  # (T,)
            own = ids.sort(dim=-1).values
            record.replayed.append(replayed)
            record.changed.append(replayed & (given.sort(dim=-1).values != own).any(dim=-1))
            ids = torch.where(given >= 0, given, ids)
            result = torch.return_types.topk((scores.gather(-1, ids), ids))
        record.chosen[self.layer] = ids
        return result


def _enter(block: nn.Module, args) -> None:
    record = getattr(_local, "state", None)
    if record is None:
        return
    mode = _TopKMode(record, getattr(block, _LAYER))
    mode.__enter__()
    _local.modes = [*getattr(_local, "modes", []), mode]


def _leave(block: nn.Module, args, output) -> None:
    modes = getattr(_local, "modes", [])
    if modes:
        _local.modes = modes[:-1]
        modes[-1].__exit__(None, None, None)


def _tap(model: nn.Module) -> tuple[int, int, int]:
    """``(L, K, E)`` of ``model``, its MoE blocks hooked at the first call (the engine calls
    this at every decode step: later calls read the layout kept on the model)."""
    layout = getattr(model, _LAYOUT, None)
    if layout is not None:
        return layout
    routing = moe_routing(model)
    blocks = moe_blocks(model)
    if routing is None or not blocks:
        raise ValueError(
            f"routing replay needs a mixture-of-experts model; {type(model).__name__} has "
            "no MoE blocks"
        )
    if getattr(unwrap_peft(model), "is_activation_checkpointing", False):
        raise ValueError(
            "routing replay cannot replay into forwards recomputed by gradient checkpointing"
        )
    for layer, block in enumerate(blocks):
        if getattr(block, _LAYER, None) is None:
            setattr(block, _LAYER, layer)
            block.register_forward_pre_hook(_enter)
            block.register_forward_hook(_leave, always_call=True)
    experts, top_k = routing
    layout = (len(blocks), top_k, experts)
    setattr(model, _LAYOUT, layout)
    return layout


@contextlib.contextmanager
def _active(record: RoutingRecord) -> Iterator[RoutingRecord]:
    if getattr(_local, "state", None) is not None:
        raise RuntimeError("routing replay: a forward is already being recorded in this thread")
    _local.state = record
    try:
        yield record
    finally:
        _local.state = None


def record_routing(model: nn.Module) -> contextlib.AbstractContextManager[RoutingRecord]:
    """Within the context, ``model``'s forwards in this thread record their experts; after
    one forward ``record.routes()`` is ``(T, L, K)``."""
    layers, top_k, experts = _tap(model)
    return _active(RoutingRecord(layers, top_k, experts, None))


def replay_routing(model: nn.Module, routes: Tensor) -> contextlib.AbstractContextManager:
    """Within the context, ``model``'s forward in this thread routes each token to
    ``routes`` (``(N, S, L, K)`` or ``(T, L, K)``; ``-1``: the model's own choice), gate weights
    from its router; ``record.chosen`` then holds what each layer used."""
    layers, top_k, experts = _tap(model)
    if routes.dtype.is_floating_point or routes.dim() not in (3, 4):
        raise ValueError(
            f"routed experts must be integer (N, S, L, K) or (T, L, K), got "
            f"{tuple(routes.shape)} {routes.dtype}"
        )
    flat = routes.reshape(-1, *routes.shape[-2:])
    if flat.shape[1:] != (layers, top_k):
        raise ValueError(
            f"routed experts have {tuple(flat.shape[1:])} (MoE layers, experts per token) but "
            f"{type(model).__name__} has ({layers}, {top_k})"
        )
    if flat.numel() and int(flat.max()) >= experts:
        raise ValueError(f"routed expert id {int(flat.max())} >= the model's {experts} experts")
    return _active(RoutingRecord(layers, top_k, experts, flat))

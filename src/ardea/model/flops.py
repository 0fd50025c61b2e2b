"""The matmul FLOPs of the work a run does, counted where the work happens, so the step
profile can say how far each step is from its floor (:mod:`ardea.trainer.profile`).

A decoder's forward over ``new`` tokens that follow ``past`` cached tokens costs

    2·M·new + 2·A·new·(2·past + new + 1) + 2·H·V·heads

- ``M``: the multiply-adds per token of the layers' matrices (every parameter of two or
  more dimensions except the input and output embeddings; a mixture-of-experts model's
  expert matrices scaled by ``top_k / experts``, the share a token uses);
- ``A = layers · query heads · head size``: causal attention, where the token at position
  ``i`` multiplies its query with ``i`` keys and its weights with ``i`` values
  (``2·A·i`` each), summed over the new positions;
- ``H·V``: the LM head, applied to ``heads`` positions (all of them in training, one per
  sampled token in decoding).

Counted: every training forward through :func:`count_forward` (the log-prob, logit and
critic forwards call it), three times its FLOPs when autograd records it (forward, and a
backward of twice the forward: gradients of inputs and of weights), once otherwise (the
old policy's, the reference's log-probs); and every in-process generation through
:func:`count_prefill` (each distinct input's prefill once) and :func:`count_decode` (then one
token per step), counted by the in-process engine where every row joins and leaves its batch.
Only real tokens count (the attention mask's), so padding, recomputation under gradient
checkpointing and a frozen LoRA base's skipped weight gradients show up as time above the
floor, not as work. Attention of a packed row is counted as one sequence (an upper bound).

Counts go to the process-wide :data:`COUNTER` (``train`` and ``decode`` totals, safe from
any thread); counts stay tensors until read, so a GPU forward is never synchronised. Beside
the FLOPs it keeps the shape the training products ran at: ``train_rows``, the rows (``N ·
S``, padding included: the projections multiply every position) of each training forward
weighted by its passes, and ``train_passes``, so that ``train_rows / train_passes`` is the
rows of an average training product, where the profile times the floor's training rate.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ardea.model.moe import moe_routing


@dataclass(frozen=True)
class ModelFlops:
    """Per-token sizes of a model (module docstring): ``matmul`` = M, ``head`` = H·V,
    ``attention`` = A."""

    matmul: float
    head: float
    attention: float

    def forward(self, new, past=0, heads=None):
        """FLOPs of ``new`` tokens after ``past`` cached ones, the head on ``heads`` of them
        (default: all). Ints or tensors of the same shape (per-row counts, summed by the
        caller)."""
        heads = new if heads is None else heads
        return (
            2 * self.matmul * new
            + 2 * self.attention * new * (2 * past + new + 1)
            + 2 * self.head * heads
        )


_SIZES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_flops(model: nn.Module) -> ModelFlops:
    """:class:`ModelFlops` of a Hugging Face causal LM or backbone (cached per module)."""
    sizes = _SIZES.get(model)
    if sizes is None:
        sizes = _SIZES[model] = _measure_sizes(model)
    return sizes


def _measure_sizes(model: nn.Module) -> ModelFlops:
    if isinstance(getattr(model, "module", None), nn.Module):  # DistributedDataParallel
        model = model.module

    embeddings = _weight(model, "get_input_embeddings")
    head = _weight(model, "get_output_embeddings")
    skip = {id(w) for w in (embeddings, head) if w is not None}
    routing = moe_routing(model)
    expert_share = routing[1] / routing[0] if routing else 1.0
    matmul = 0.0
    for name, param in model.named_parameters():
        if param.dim() < 2 or id(param) in skip:
            continue
        matmul += param.numel() * (expert_share if ".experts." in f".{name}." else 1.0)
    config = getattr(model, "config", None)
    layers = _first(config, "num_hidden_layers", "n_layer")
    heads = _first(config, "num_attention_heads", "n_head")
    hidden = _first(config, "hidden_size", "n_embd")
    head_dim = getattr(config, "head_dim", None) or (hidden // heads if heads else 0)
    return ModelFlops(
        matmul=matmul,
        head=float(head.numel()) if head is not None else 0.0,
        attention=float(layers * heads * head_dim),
    )


def _weight(model: nn.Module, getter: str) -> Tensor | None:
    get = getattr(model, getter, None)
    try:
        module = get() if callable(get) else None
    except (AttributeError, NotImplementedError):
        return None
    return getattr(module, "weight", None) if module is not None else None


def _first(config, *names: str) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return 0


class FlopCounter:
    """``train`` and ``decode`` FLOP totals and the training products' rows, added from any
    thread (module docstring)."""

    KINDS = ("train", "decode", "train_rows", "train_passes")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = dict.fromkeys(self.KINDS, 0.0)
        self._pending: list[tuple[str, Tensor]] = []

    def add(self, kind: str, flops) -> None:
        """Add ``flops`` (a number, or a 0-d tensor read only by :meth:`totals`)."""
        with self._lock:
            if isinstance(flops, Tensor):
                self._pending.append((kind, flops.detach()))
            else:
                self._totals[kind] += float(flops)

    def totals(self) -> dict[str, float]:
        """The totals so far, one per :attr:`KINDS`."""
        with self._lock:
            pending, self._pending = self._pending, []
            for kind, flops in pending:
                self._totals[kind] += float(flops)
            return dict(self._totals)

    def since(self, before: dict[str, float]) -> dict[str, float]:
        """What was added since :meth:`totals` returned ``before``."""
        return {kind: total - before[kind] for kind, total in self.totals().items()}


COUNTER = FlopCounter()


def count_forward(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None) -> None:
    """Count a training-side forward of ``input_ids (N, S)`` through ``model`` (a causal LM:
    its head on every token; a backbone: none), only the mask's real tokens, three times
    when autograd records it."""
    sizes = model_flops(model)
    if attention_mask is None:
        n, s = input_ids.shape
        flops = n * sizes.forward(s)
    else:
        lengths = attention_mask.sum(dim=-1, dtype=torch.float32)  # (N,) float32: any device
        flops = sizes.forward(lengths).sum()
    passes = _passes()
    COUNTER.add("train", flops * passes)
    COUNTER.add("train_rows", input_ids.numel() * passes)
    COUNTER.add("train_passes", passes)


def count_head(head: nn.Module, tokens: Tensor) -> None:
    """Count an LM head applied apart from its backbone to ``tokens (T, H)``."""
    weight = getattr(head, "weight", None)
    if weight is not None:
        COUNTER.add("train", 2.0 * weight.numel() * tokens.shape[0] * _passes())


def _passes() -> int:
    return 3 if torch.is_grad_enabled() else 1


def count_prefill(model: nn.Module, inputs: Iterable[Sequence[int]]) -> None:
    """Count the prefill of each distinct sequence of ``inputs`` (the head on its last
    token only), as the in-process engine runs it when rows join its batch."""
    sizes = model_flops(model)
    COUNTER.add("decode", sum(sizes.forward(len(ids), 0, 1) for ids in set(map(tuple, inputs))))


def count_decode(model: nn.Module, steps: int, past: int) -> None:
    """Count ``steps`` one-token decode steps of a row after ``past`` positions."""
    if steps > 0:
        COUNTER.add("decode", model_flops(model).forward(steps, past))

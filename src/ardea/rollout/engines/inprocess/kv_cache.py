"""The KV cache of the in-process engine: a Hugging Face ``DynamicCache`` whose layers
append in place into buffers preallocated for the whole generation (prompt + new tokens),
instead of ``torch.cat``-ing the cache at every step. A hybrid model's linear-attention
layers (gated delta nets, short convolutions: Qwen3.5, Qwen3-Next, LFM2) keep transformers'
own layer, whose per-row convolution and recurrent states have no sequence dimension:
rows are selected and merged along the batch as they are. Any other cache layout (sliding
windows, other layer kinds, transformers < 4.56) keeps the stock implementation, and its
rows are selected but never merged.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

try:
    from transformers.cache_utils import DynamicLayer
except ImportError:  # transformers < 4.56: caches hold plain lists of tensors
    DynamicLayer = None
try:
    from transformers.cache_utils import LinearAttentionLayer
except ImportError:  # transformers before its hybrid caches
    LinearAttentionLayer = None


def new_cache(
    model: torch.nn.Module, capacity: int, dtype: torch.dtype | None = None
) -> DynamicCache:
    """A ``DynamicCache`` whose plain full-attention layers are :class:`PreallocatedLayer`s
    holding ``capacity`` positions (in ``dtype``, default: that of the first keys written)
    when every other layer is a linear-attention one (module docstring); any other layout
    keeps the stock implementation."""
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # transformers < 4.56 has no config argument
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    if DynamicLayer is not None and layers and all(_known(x) for x in layers):
        cache.layers = [
            PreallocatedLayer(capacity, dtype) if type(x) is DynamicLayer else x for x in layers
        ]
    return cache


def _known(layer) -> bool:
    """A plain attention layer, or a plain linear-attention one (module docstring)."""
    return type(layer) is DynamicLayer or _linear(layer)


def _linear(layer) -> bool:
    """A plain linear-attention layer: per-row states, no sequence dimension."""
    return LinearAttentionLayer is not None and type(layer) is LinearAttentionLayer


class PreallocatedLayer(DynamicLayer or object):
    """A ``DynamicLayer`` that appends in place: keys and values live in ``(N, H, P + T, D)``
    buffers and attention gets ``(N, H, length, D)`` views, so a step writes one position
    instead of copying the whole cache as ``torch.cat`` does."""

    def __init__(self, capacity: int, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.capacity, self.length, self.buffer_dtype = capacity, 0, dtype

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        n, heads, _, _ = key_states.shape
        self.device = key_states.device
        dtype = self.buffer_dtype or key_states.dtype
        shape = (n, heads, self.capacity, key_states.shape[-1])
        self.key_buffer = key_states.new_zeros(shape, dtype=dtype)
        self.value_buffer = value_states.new_zeros(
            shape[:-1] + value_states.shape[-1:], dtype=dtype
        )
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache full: {end} positions > capacity {self.capacity}")
        self.key_buffer[:, :, start:end] = key_states
        self.value_buffer[:, :, start:end] = value_states
        self.length = end
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
        end = self.length
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]


def select_rows(cache: DynamicCache, index: torch.Tensor) -> None:
    """Keep the rows ``index`` (``(K,)`` ints, repeats allowed, or an ``(N,)`` bool mask) of
    every layer of ``cache``: attention keys and values, and the convolution and recurrent
    states of a hybrid model's linear-attention layers (whose transformers layer classes
    have no ``batch_select_indices``, or one that leaves their states out)."""
    if index.dtype == torch.bool:
        index = index.nonzero().squeeze(1)
    layers = getattr(cache, "layers", None)
    if layers is None:  # transformers < 4.56: lists of tensors
        cache.batch_select_indices(index)
        return
    for layer in layers:
        if isinstance(layer, PreallocatedLayer):
            layer.batch_select_indices(index)
        else:  # transformers' own: its row selection along the batch, every state included
            layer.reorder_cache(index)


def can_merge(cache: DynamicCache) -> bool:
    """Whether rows of caches like ``cache`` can be merged (:func:`merge_caches`): every
    layer a :class:`PreallocatedLayer` or a plain linear-attention layer."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(isinstance(x, PreallocatedLayer) or _linear(x) for x in layers)


def merge_caches(caches: list[DynamicCache], lengths: list[int], capacity: int) -> DynamicCache:
    """The rows of ``caches`` (each filled to ``lengths[i]`` columns) in one cache, each
    cache's columns right-aligned to end at ``L = max(lengths)`` (zeros to their left, which
    the rows' masks exclude), with room for ``capacity`` columns; a linear-attention layer's
    states stacked by row, its token count set to ``L`` (the model reads the cache's position
    from its first layer). Reuses the first cache's object; :func:`can_merge` must hold."""
    length = max(lengths)
    merged = caches[0]
    for index, layer in enumerate(merged.layers):
        parts = [cache.layers[index] for cache in caches]
        if not isinstance(layer, PreallocatedLayer):
            _stack_states(layer, parts, length)
            continue
        keys = [part.key_buffer[:, :, :n] for part, n in zip(parts, lengths)]
        values = [part.value_buffer[:, :, :n] for part, n in zip(parts, lengths)]
        layer.key_buffer = _aligned(keys, length, capacity)
        layer.value_buffer = _aligned(values, length, capacity)
        layer.capacity, layer.length = capacity, length
        layer.keys = layer.key_buffer[:, :, :length]
        layer.values = layer.value_buffer[:, :, :length]
    return merged


def _stack_states(layer, parts: list, length: int) -> None:
    """``parts``' convolution and recurrent states (one row each per sequence) stacked by
    row into ``layer`` (the first part), with ``length`` tokens seen."""
    for i in range(layer.number_of_states):
        if layer.is_conv_states_initialized[i]:
            layer.conv_states[i] = torch.cat([part.conv_states[i] for part in parts])
        if layer.is_recurrent_states_initialized[i]:
            layer.recurrent_states[i] = torch.cat([part.recurrent_states[i] for part in parts])
    layer.cumulative_length_linear.fill_(length)


def _aligned(parts: list[torch.Tensor], length: int, capacity: int) -> torch.Tensor:
    """(sum N_i, H, capacity, D): each (N_i, H, n_i, D) part in columns [length − n_i, length)."""
    first = parts[0]
    rows = sum(p.shape[0] for p in parts)
    out = first.new_zeros(rows, first.shape[1], capacity, first.shape[3])
    start = 0
    for part in parts:
        out[start : start + part.shape[0], :, length - part.shape[2] : length] = part
        start += part.shape[0]
    return out

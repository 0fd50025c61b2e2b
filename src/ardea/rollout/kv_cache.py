"""The KV cache of the in-process engine: a Hugging Face ``DynamicCache`` whose layers
append in place into buffers preallocated for the whole generation (prompt + new tokens),
instead of ``torch.cat``-ing the cache at every step. Any cache layout this does not know
(sliding windows, other layer kinds, transformers < 4.56) keeps the stock implementation.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

try:
    from transformers.cache_utils import DynamicLayer
except ImportError:  # transformers < 4.56: caches hold plain lists of tensors
    DynamicLayer = None


def new_cache(
    model: torch.nn.Module, capacity: int, dtype: torch.dtype | None = None
) -> DynamicCache:
    """A ``DynamicCache`` whose plain full-attention layers are :class:`PreallocatedLayer`s
    holding ``capacity`` positions (in ``dtype``, default: that of the first keys written);
    any other layer kind keeps the stock implementation."""
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # transformers < 4.56 has no config argument
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    if DynamicLayer is not None and layers and all(type(x) is DynamicLayer for x in layers):
        cache.layers = [PreallocatedLayer(capacity, dtype) for _ in layers]
    return cache


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

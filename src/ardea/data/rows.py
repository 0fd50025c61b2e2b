"""Row operations on batches: dicts of tensors whose first dimension is the row.

Every value of a batch is ``(N, ...)``; ``(N, S)`` values are right-padded sequences (or
per-position values aligned with them). These helpers select, concatenate and trim rows
without knowing what the keys mean, apart from the padding value of each key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor


def batch_rows(batch: Mapping[str, Tensor]) -> int:
    """The common first dimension of every value; raises when they disagree."""
    sizes = {k: v.shape[0] for k, v in batch.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"batch values disagree on their number of rows: {sizes}")
    return next(iter(sizes.values()))


def select_rows(batch: Mapping[str, Tensor], index: Tensor) -> dict[str, Tensor]:
    """Rows ``index`` (a 1-D long tensor) of every value."""
    return {k: v[index.to(v.device)] for k, v in batch.items()}


def concat_rows(
    batches: Sequence[Mapping[str, Tensor]], pad_values: Mapping[str, float | int]
) -> dict[str, Tensor]:
    """Stack the rows of ``batches`` (same keys); ``(N, S)`` values are right-padded to the
    longest ``S`` with ``pad_values[key]`` (default 0)."""
    keys = list(batches[0])
    if any(list(b) != keys for b in batches):
        raise ValueError("cannot concatenate batches with different keys")
    out = {}
    for key in keys:
        parts = [b[key] for b in batches]
        if parts[0].dim() >= 2:
            width = max(p.shape[1] for p in parts)
            value = pad_values.get(key, 0)
            parts = [
                torch.nn.functional.pad(p, (0, width - p.shape[1]), value=value)
                if p.shape[1] < width
                else p
                for p in parts
            ]
        out[key] = torch.cat(parts)
    return out


def trim_padding(batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Drop the columns to the right of the last attended position of every row.

    The width comes from the ``*attention_mask`` values (``(N, S)``, 1 = real token); every
    ``(N, S, ...)`` value with that ``S`` is cut to the same width. A batch without an
    attention mask is returned unchanged.
    """
    masks = [v for k, v in batch.items() if k.endswith("attention_mask")]
    if not masks or masks[0].shape[0] == 0:
        return dict(batch)
    full = masks[0].shape[1]
    width = max(int(m.sum(dim=-1).max()) for m in masks)
    return {k: v[:, :width] if v.dim() >= 2 and v.shape[1] == full else v for k, v in batch.items()}

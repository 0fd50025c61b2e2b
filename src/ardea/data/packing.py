"""Packing several documents into one row, kept apart by restarting position ids.

A packed row concatenates whole :class:`SFTSample` documents; ``position_ids`` count
``0, 1, ...`` within each document. The model gets **no attention mask** for packed rows
(:meth:`ardea.data.TrajectoryBatch.model_inputs`): given position ids and no mask, ``transformers`` finds the documents from where the
positions restart and attends only within each (``find_packed_sequence_indices`` in
``transformers.masking_utils``; flash-attention kernels use the same rule). Padding is a
document of its own: its positions restart at 0 as well and its loss mask is 0.

The first token of every document gets loss mask 0 in a packed row. In a next-token loss
a document's first token is never predicted (there is no context before it); in a packed
row the position before it belongs to the previous document, so it must not be scored.
With this, the token-mean cross-entropy over a packed batch equals the one over the same
documents unpacked, up to floating-point rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ardea.data.sft import SFTSample
from ardea.data.trajectory import TrajectoryBatch


@dataclass(frozen=True)
class PackedSample:
    """One packed row: documents back to back, positions restarting at 0 per document."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    position_ids: tuple[int, ...]


def _pack_row(documents: Sequence[SFTSample]) -> PackedSample:
    input_ids: list[int] = []
    loss_mask: list[int] = []
    position_ids: list[int] = []
    for document in documents:
        n = len(document.input_ids)
        input_ids += document.input_ids
        loss_mask += [0, *document.loss_mask[1:]]
        position_ids += range(n)
    return PackedSample(tuple(input_ids), tuple(loss_mask), tuple(position_ids))


def pack_samples(samples: Sequence[SFTSample], max_length: int) -> list[PackedSample]:
    """Pack ``samples`` into rows of at most ``max_length`` tokens, greedy first-fit in order.

    Each sample goes into the first row (in creation order) with room for it, else starts a
    new row; documents keep their input order within a row. Deterministic.

    Raises:
        ValueError: a sample is empty or longer than ``max_length``.
    """
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    rows: list[list[SFTSample]] = []
    free: list[int] = []
    for index, sample in enumerate(samples):
        n = len(sample.input_ids)
        if not 0 < n <= max_length:
            raise ValueError(f"sample {index} has {n} tokens; packing needs 1..{max_length}")
        for row, room in enumerate(free):
            if n <= room:
                rows[row].append(sample)
                free[row] -= n
                break
        else:
            rows.append([sample])
            free.append(max_length - n)
    return [_pack_row(row) for row in rows]


def collate_packed(samples: Sequence[PackedSample], pad_token_id: int) -> TrajectoryBatch:
    """Right-pad packed rows into a :class:`~ardea.data.TrajectoryBatch` with
    ``position_ids`` (restarting at 0 per document and for the padding), so that the model
    gets no attention mask (module docstring); ``loss_mask`` is 0 on each document's first
    token and on padding."""
    if not samples:
        raise ValueError("cannot collate an empty list of packed samples")
    length = max(len(s.input_ids) for s in samples)
    n = len(samples)
    input_ids = torch.full((n, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, length), dtype=torch.long)
    position_ids = torch.zeros((n, length), dtype=torch.long)
    loss_mask = torch.zeros((n, length), dtype=torch.bool)
    for row, sample in enumerate(samples):
        k = len(sample.input_ids)
        input_ids[row, :k] = torch.tensor(sample.input_ids, dtype=torch.long)
        attention_mask[row, :k] = 1
        position_ids[row, :k] = torch.tensor(sample.position_ids, dtype=torch.long)
        position_ids[row, k:] = torch.arange(length - k)
        loss_mask[row, :k] = torch.tensor(sample.loss_mask, dtype=torch.bool)
    return TrajectoryBatch.from_tensors(
        input_ids, attention_mask, loss_mask, position_ids=position_ids
    )

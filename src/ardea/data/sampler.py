"""Deterministic, resumable order over a fixed set of examples.

Each epoch is a fresh permutation drawn from ``(seed, epoch)``; the position is
``(epoch, index)``. Saving :meth:`EpochSampler.state_dict` and loading it into a new
sampler continues with exactly the indices an uninterrupted run would have drawn,
including across epoch boundaries.
"""

from __future__ import annotations

import torch


class EpochSampler:
    """Yields batches of indices into ``range(size)``, epoch after epoch."""

    def __init__(self, size: int, batch_size: int, seed: int) -> None:
        if size < 1:
            raise ValueError(f"cannot sample from an empty dataset (size={size})")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.size = size
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.index = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.size, generator=generator).tolist()

    def next_batch(self) -> list[int]:
        """The next ``batch_size`` indices; a batch may span two epochs."""
        batch: list[int] = []
        while len(batch) < self.batch_size:
            if self.index == self.size:
                self.epoch += 1
                self.index = 0
                self._order = self._permutation(self.epoch)
            take = min(self.batch_size - len(batch), self.size - self.index)
            batch.extend(self._order[self.index : self.index + take])
            self.index += take
        return batch

    def peek(self, batches: int) -> list[list[int]]:
        """The next ``batches`` batches that :meth:`next_batch` will return, without
        advancing."""
        if batches <= 0:
            return []
        ahead = EpochSampler(self.size, self.batch_size, self.seed)
        ahead.epoch, ahead.index, ahead._order = self.epoch, self.index, self._order
        return [ahead.next_batch() for _ in range(batches)]

    def state_dict(self) -> dict[str, int]:
        return {"size": self.size, "seed": self.seed, "epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["size"] != self.size or state["seed"] != self.seed:
            raise ValueError(
                f"sampler state is for size={state['size']} seed={state['seed']}, "
                f"this sampler has size={self.size} seed={self.seed}; the dataset or seed changed"
            )
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._permutation(self.epoch)

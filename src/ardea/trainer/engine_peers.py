"""The ranks that drive one engine's servers, talking over torchrun's rendezvous store
(:class:`ardea.rollout.peers.EnginePeers`).

Each :class:`StorePeers` has a store connection of its own, so that an engine waiting for a
message (in the trainer's thread, or a background worker's) never holds up another thread's
store calls (the heartbeat's); its keys live under ``ardea/engines/<generation>/<name>/``,
``generation`` telling apart the trainers of one launch (a staged run builds one a stage).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch.distributed as dist

from ardea.errors import ArdeaError

POLL_S = 1.0  # one store wait; the loop around it ends at the caller's deadline


class StorePeers:
    """This rank among the job's ranks that drive the engine ``name`` (module docstring)."""

    def __init__(
        self, name: str, generation: int, rank: int, world_size: int, timeout_s: float
    ) -> None:
        self.rank, self.world_size, self.name = rank, world_size, name
        store = dist.TCPStore(  # timeout_s: connecting, and every call but wait (POLL_S)
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=timeout_s),
        )
        self.store = dist.PrefixStore(f"ardea/engines/{generation}/{name}/", store)

    def post(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def wait(self, key: str, timeout_s: float) -> str:
        """The value under ``key`` once posted; an :class:`ArdeaError` naming the key and
        the engine after ``timeout_s`` seconds."""
        deadline = time.monotonic() + timeout_s
        while not self.store.check([key]):
            if time.monotonic() > deadline:
                raise ArdeaError(
                    f"rank {self.rank} waited {timeout_s:.0f} s for '{key}' from the other "
                    f"ranks driving the {self.name} engine's servers; did rank 0 stop?"
                )
            try:
                self.store.wait([key], timedelta(seconds=POLL_S))
            except dist.DistStoreError:  # not yet: look at the deadline again
                pass
        return self.store.get(key).decode()

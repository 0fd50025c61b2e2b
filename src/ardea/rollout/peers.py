"""The other processes of a torchrun job that drive one engine together.

An engine whose servers the job shares (``rollout.engine=vllm``) is built on every rank with
``EngineSpec.peers``: rank 0 leads (it starts or connects to the servers and loads every
policy version into them), the other ranks follow (they send their share of each rollout's
requests to the same servers). They agree through :class:`EnginePeers`, short text messages
by key on the job's rendezvous store (the trainer's
:class:`~ardea.trainer.engine_peers.StorePeers`): no collective, so an engine may call it
from a background worker's thread.
"""

from __future__ import annotations

from typing import Protocol


class EnginePeers(Protocol):
    """This rank's place among the processes that drive one engine, and their messages."""

    rank: int  # 0 leads
    world_size: int

    def post(self, key: str, value: str) -> None:
        """Leave ``value`` under ``key`` for the others (a key is posted once)."""

    def wait(self, key: str, timeout_s: float) -> str:
        """The value posted under ``key``, once it is there (a
        :class:`~ardea.errors.ArdeaError` naming the key after ``timeout_s`` seconds)."""

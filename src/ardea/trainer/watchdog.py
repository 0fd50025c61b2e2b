"""Which rank stopped: a heartbeat over torchrun's TCPStore, read when a collective fails.

A collective that fails (a peer's connection closed, or ``trainer.dist_timeout_s`` passed)
says nothing about *which* rank is gone. Every rank therefore runs a daemon thread that
increments its own counter ``ardea/heartbeat/<rank>`` in the rendezvous store every
``INTERVAL_S`` seconds. When a collective fails, :meth:`Heartbeat.silent_ranks` reads every
counter twice, ``2 * INTERVAL_S`` apart: a rank whose counter did not move is dead or hung
(killed, stopped, or its node lost). Counters, not timestamps, so clocks of different
nodes need not agree.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import torch.distributed as dist

JOIN_S = 10.0  # longest wait for the heartbeat thread to end (a store call in flight)
INTERVAL_S = 1.0
PREFIX = "ardea/heartbeat/"


class Heartbeat:
    """This rank's heartbeat thread and the reading of everyone's (module docstring)."""

    def __init__(self, rank: int, world_size: int, timeout_s: float) -> None:
        self.rank, self.world_size = rank, world_size
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=timeout_s),
        )
        self.store = dist.PrefixStore(PREFIX, store)
        self.store.add(str(rank), 1)
        # the how-many-th Heartbeat of this launch (a staged run makes one per stage): every
        # rank makes them in the same order, so all agree on it and its keys are unique
        self.generation = (self.store.add("instances", 1) - 1) // world_size
        self._waits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="ardea-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            try:
                self.store.add(str(self.rank), 1)
            except Exception:  # the store is gone: the run is ending, the loop reports it
                return

    def _counters(self) -> list[int]:
        return [self.store.add(str(rank), 0) for rank in range(self.world_size)]

    def silent_ranks(self) -> list[int]:
        """Ranks whose heartbeat did not move over ``2 * INTERVAL_S`` seconds."""
        before = self._counters()
        time.sleep(2 * INTERVAL_S)
        after = self._counters()
        return [rank for rank, (a, b) in enumerate(zip(before, after)) if a == b]

    def after(self, ranks: list[int], wait_s: float) -> None:
        """Each of ``ranks`` says it finished its part (writing a checkpoint); every rank
        waits until all of them have, up to ``wait_s`` seconds, heartbeats going on (a
        collective barrier would fail after ``trainer.dist_timeout_s`` while a large
        checkpoint is still being written). Every rank calls it in the same order."""
        self._waits += 1
        key = f"written/{self.generation}/{self._waits}/"
        if self.rank in ranks:
            self.store.set(key + str(self.rank), "1")
        self.store.wait([key + str(rank) for rank in ranks], timedelta(seconds=wait_s))

    def close(self) -> None:
        """Stop the heartbeat and wait for its thread: a daemon thread still inside a store
        call when the process exits can abort it ("terminate called without an active
        exception", seen at the end of torchrun runs)."""
        self._stop.set()
        self._thread.join(timeout=JOIN_S)


def is_collective_failure(error: BaseException) -> bool:
    """Whether ``error`` is a failed or timed-out collective (gloo / NCCL / c10d)."""
    text = str(error)
    markers = ("gloo", "NCCL", "Timed out", "Connection closed", "Connection reset")
    return isinstance(error, dist.DistError) or any(m in text for m in markers)


def describe_failure(error: BaseException, heartbeat: Heartbeat, timeout_s: float) -> str:
    """The message a rank dies with when a collective failed: which ranks are silent."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    try:
        silent = heartbeat.silent_ranks()
    except Exception:  # the rendezvous store itself is gone (torchrun's agent ended)
        silent = None
    if silent is None:
        who = "the rendezvous store is unreachable (torchrun is ending the run)"
    elif silent:
        names = ("rank " if len(silent) == 1 else "ranks ") + ", ".join(map(str, silent))
        who = f"{names} stopped responding (no heartbeat for {2 * INTERVAL_S:g} s)"
    else:
        who = "every rank is still alive (a rank may have raised an error: see its output)"
    return (
        f"rank {heartbeat.rank}: a collective with the other ranks failed or waited more "
        f"than trainer.dist_timeout_s={timeout_s:g} s: {who}. ({first})"
    )

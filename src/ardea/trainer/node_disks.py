"""Nodes with disks of their own: which ranks write a run's checkpoints, and which
checkpoint every rank resumes from.

Under torchrun, rank 0 prepares the run directory and leaves a random token in it
(``.launch``); the first rank of every other node (``LOCAL_RANK`` 0) looks for that token in
the run directory it sees. Where the token is there, the node shares rank 0's disk and rank
0 writes for it; where it is not (two machines without a shared file system, or two node
ranks on one machine given different ``trainer.output_dir``), that rank prepares the
directory on its own disk and writes every checkpoint there too: a whole one under DDP (its
replica holds everything), its node's shard files, the run's state and the Hugging Face
export under FSDP2. Each node then resumes from its own files: the ranks agree on the
latest checkpoint that every one of them holds. One process writes no token.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Callable
from pathlib import Path

from ardea.errors import ArdeaError
from ardea.trainer.checkpoint import checkpoint_dir, list_checkpoints
from ardea.trainer.distributed import Distributed
from ardea.trainer.setup import resume_checkpoint

TOKEN_FILE = ".launch"


def checkpoint_writers(dist: Distributed, run_dir: Path, prepare: Callable[[], None]) -> list[int]:
    """The ranks that write checkpoints, rank 0 first (module docstring); ``prepare()``
    makes the run directory on a writer's disk. Every rank calls it."""
    if dist.is_main:
        prepare()
    if not dist.active:
        return [0]
    token = None
    if dist.is_main:
        token = secrets.token_hex(16)
        (Path(run_dir) / TOKEN_FILE).write_text(token)
    token = dist.broadcast(token)
    own_disk = False
    if not dist.is_main and dist.local_rank == 0:
        try:
            own_disk = (Path(run_dir) / TOKEN_FILE).read_text() != token
        except OSError:
            own_disk = True
        if own_disk:
            prepare()
    return [0] + [rank for rank, own in enumerate(dist.gather(own_disk)) if own]


def agreed_checkpoint(dist: Distributed, run_dir: Path, resume: str) -> Path | None:
    """The checkpoint this rank resumes from, per ``trainer.resume``: under ``auto`` the
    latest step every rank's run directory holds (the same on a shared disk), a path (or
    ``never``) as each rank finds it on its own disk. Every rank calls it."""
    if resume != "auto" or not dist.active:
        return resume_checkpoint(run_dir, resume)
    held = [path.name for path in list_checkpoints(run_dir)]
    every = dist.gather(held)
    name = latest_common(every)
    if name is None:
        return None
    if dist.is_main and name != every[0][-1]:
        print(f"[ardea] resuming from {name}: the latest checkpoint every node holds "
              f"(rank 0 also has {every[0][-1]})", file=sys.stderr)  # fmt: skip
    return checkpoint_dir(run_dir, name)


def latest_common(held: list[list[str]]) -> str | None:
    """The latest checkpoint name every rank holds (``held``: each rank's, oldest first);
    None when no rank holds one.

    Raises:
        ArdeaError: some ranks hold checkpoints but none is every rank's.
    """
    common = set(held[0]).intersection(*held[1:])
    if common:
        return max(common)
    if not any(held):
        return None
    latest = "; ".join(
        f"rank {r}: {names[-1] if names else 'none'}" for r, names in enumerate(held)
    )
    raise ArdeaError(
        f"trainer.resume=auto: no checkpoint is held by every rank (the latest of each, in its "
        f"own run directory: {latest}); each node resumes from its own disk: give every node "
        "its run directory's checkpoints, or start a new run"
    )

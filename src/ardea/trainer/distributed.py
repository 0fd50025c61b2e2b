"""Data parallelism under ``torchrun``: the process group, module wrapping, and the few
collectives the trainer needs. Only the trainer layer knows about ranks.

``trainer.distributed`` picks the mode: ``none`` (one process), ``ddp``
(:class:`~torch.nn.parallel.DistributedDataParallel`: every rank holds the whole model and
gradients are all-reduced) or ``fsdp2`` (:func:`torch.distributed.fsdp.fully_shard` on every
decoder layer and on the root: parameters, gradients and optimizer state sharded across the
ranks, gathered per layer for the forward and backward). ``auto`` is ``none`` for one process
and ``fsdp2`` when torchrun starts several. The process group comes from torchrun's
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``: the
rendezvous binds where torchrun says), with gloo on CPU and NCCL on GPUs and a timeout of
``trainer.dist_timeout_s`` seconds on every collective; a collective that fails ends the
rank with an error naming the ranks that stopped (:mod:`ardea.trainer.watchdog`).

Gradients: losses are normalised by counts summed over all ranks (:meth:`Distributed.sum`),
so the whole batch's gradient is the *sum* of the ranks' gradients; DDP and FSDP2 average
them, so :attr:`Distributed.loss_scale` (the world size) multiplies each loss before its
backward.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from ardea.errors import ArdeaError, ConfigError
from ardea.trainer.engine_peers import StorePeers
from ardea.trainer.row_shards import RowShards
from ardea.trainer.watchdog import Heartbeat, describe_failure, is_collective_failure

CPU_BUCKET_MB = 1024  # DDP's gradient bucket on CPU (wrap: one bucket, not overlapped)
WRITE_WAIT_S = 3600.0  # longest the ranks wait for rank 0 to write a checkpoint


def launched_world_size() -> int:
    """The number of processes torchrun started (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


#: ``trainer.distributed=auto`` under torchrun replicates the policy (DDP) while one whole
#: replica's training state — float32 weights, gradients and Adam's two moments, 16 bytes a
#: parameter — takes at most this share of one process's memory, and shards it (FSDP2)
#: above: the rest is room for a critic, a reference, the engine's copy and activations.
#: On an 80 GB GPU that is DDP up to 625M parameters; on a 24 GiB host with 2 processes,
#: up to 100M.
AUTO_REPLICA_SHARE = 1 / 8
TRAINING_BYTES_PER_PARAMETER = 16


def process_memory(device: torch.device) -> int:
    """Bytes one process may use: its GPU's memory, or its share of the host's."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return host // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def auto_mode(parameters: int, memory: int) -> str:
    """``trainer.distributed=auto`` under torchrun for a policy of ``parameters`` and one
    process's ``memory`` bytes: ``ddp`` while a replica's training state fits
    (:data:`AUTO_REPLICA_SHARE`), else ``fsdp2``. Replicas are faster wherever they fit:
    FSDP2 all-gathers every layer's weights for each forward and backward."""
    replica = TRAINING_BYTES_PER_PARAMETER * parameters
    return "ddp" if replica <= AUTO_REPLICA_SHARE * memory else "fsdp2"


def resolve_mode(mode: str, world_size: int) -> str:
    """``trainer.distributed`` as it runs: ``auto`` → ``none`` for one process, else left
    ``auto`` until :meth:`Distributed.settle` sees the policy (:func:`auto_mode`); a mode
    that does not fit the launch is a :class:`ConfigError`."""
    if mode == "auto":
        return "none" if world_size == 1 else "auto"
    if mode == "none" and world_size > 1:
        raise ConfigError(
            f"trainer.distributed=none but torchrun started {world_size} processes "
            "(WORLD_SIZE); use ddp, fsdp2 or auto, or launch one process"
        )
    if mode != "none" and "RANK" not in os.environ:
        raise ConfigError(
            f"trainer.distributed={mode} needs a torchrun launch (RANK and WORLD_SIZE are "
            "unset): torchrun --nproc-per-node N ardea train ..., or trainer.distributed=auto"
        )
    return mode


class Distributed:
    """This process's place in the run: ``mode``, ``rank``, ``world_size`` and ``device``."""

    def __init__(self, mode: str, device: torch.device, timeout_s: float) -> None:
        self.mode = resolve_mode(mode, launched_world_size())
        self.rank, self.world_size = 0, 1
        #: the ranks that write checkpoints (:mod:`ardea.trainer.node_disks`): rank 0, and the
        #: first rank of every node whose disk does not hold rank 0's run directory
        self.writers = [0]
        self.heartbeat: Heartbeat | None = None
        if self.mode != "none" and device.type == "cuda" and device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)  # one GPU per process
        self.device = device
        if self.mode != "none":
            backend = "nccl" if device.type == "cuda" else "gloo"
            if not dist.is_initialized():
                dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            self.heartbeat = Heartbeat(self.rank, self.world_size, timeout_s)
        self.timeout_s = timeout_s

    @property
    def active(self) -> bool:
        return self.mode != "none"

    def settle(self, policy: nn.Module) -> str | None:
        """Resolve ``trainer.distributed=auto`` for ``policy`` (:func:`auto_mode`), before
        anything is wrapped; returns a line saying what was chosen and why (None when the
        mode was given)."""
        if self.mode != "auto":
            return None
        parameters = sum(p.numel() for p in policy.parameters())
        memory = process_memory(self.device)
        self.mode = auto_mode(parameters, memory)
        replica = TRAINING_BYTES_PER_PARAMETER * parameters
        return (
            f"trainer.distributed=auto: {self.mode} ({parameters / 1e6:.1f}M parameters; a "
            f"replica's training state {replica / 2**30:.2f} GiB of {memory / 2**30:.0f} GiB "
            "a process)"
        )

    @property
    def rows(self) -> RowShards:
        """How this rank shares a rollout's rows with the others (pinning)."""
        return RowShards(self.rank, self.world_size)

    @property
    def local_rank(self) -> int:
        """This process's index on its node (torchrun's ``LOCAL_RANK``)."""
        return int(os.environ.get("LOCAL_RANK", "0")) if self.active else 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes files and logs."""
        return self.rank == 0

    @property
    def loss_scale(self) -> float:
        """Multiplies each loss before backward so averaged gradients become sums."""
        return float(self.world_size)

    # ------------------------------------------------------------------ wrapping
    def wrap(self, module: nn.Module, *, trainable: bool, compute_dtype=None) -> nn.Module:
        """``module`` wrapped for this mode. FSDP2 shards frozen modules too; DDP leaves a
        frozen module as it is (replicated: there is no gradient to all-reduce)."""
        if self.mode == "fsdp2":
            mixed = MixedPrecisionPolicy()
            if self.device.type == "cuda" and compute_dtype is not None:
                mixed = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
            for layer in decoder_layers(module):
                fully_shard(layer, mp_policy=mixed)
            fully_shard(module, mp_policy=mixed)
            return module
        if self.mode == "ddp" and trainable:
            if self.device.type == "cuda":
                return DistributedDataParallel(
                    module, device_ids=[self.device.index], gradient_as_bucket_view=True
                )
            # on CPU gloo all-reduces on the cores the backward computes on, so a bucket
            # sent early overlaps nothing and each costs a call: the gradients go in one
            # bucket after the backward (the first, 1 MB, aside), as views of it (no copy)
            return DistributedDataParallel(
                module, bucket_cap_mb=CPU_BUCKET_MB, gradient_as_bucket_view=True
            )
        return module

    @staticmethod
    @contextmanager
    def accumulating(modules: list[nn.Module], accumulate: bool):
        """With ``accumulate``, DDP modules keep this micro-batch's gradients local
        (``no_sync``, around its forward and backward): they are all-reduced once, with the
        update's last micro-batch. FSDP2 reduce-scatters every micro-batch, so that its
        gradients stay sharded in between."""
        with ExitStack() as stack:
            if accumulate:
                for module in modules:
                    if isinstance(module, DistributedDataParallel):
                        stack.enter_context(module.no_sync())
            yield

    # --------------------------------------------------------------- collectives
    def sum(self, values: Mapping[str, float], *, maximum: tuple[str, ...] = ()) -> dict:
        """``values`` summed over the ranks (the names in ``maximum``: their maximum), in
        one all-reduce per kind. Every rank must pass the same names."""
        out = dict(values)
        if not self.active:
            return out
        for names, op in (
            ([k for k in sorted(out) if k not in maximum], dist.ReduceOp.SUM),
            ([k for k in sorted(out) if k in maximum], dist.ReduceOp.MAX),
        ):
            if names:
                tensor = torch.tensor([float(out[k]) for k in names], dtype=torch.float64)
                tensor = tensor.to(self.device)
                dist.all_reduce(tensor, op=op)
                out.update(zip(names, tensor.cpu().tolist()))
        return out

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (tensors on CPU), in rank order; only between this run's own
        processes."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def after(self, ranks: list[int]) -> None:
        """Wait until every rank of ``ranks`` has finished its part (writing its files: a
        checkpoint's, up to ``WRITE_WAIT_S``); every rank calls it, in the same order."""
        if self.heartbeat is not None:
            self.heartbeat.after(ranks, WRITE_WAIT_S)

    def engine_peers(self, name: str) -> StorePeers | None:
        """The job's ranks that drive the engine ``name``'s servers together (None: one
        process)."""
        if self.heartbeat is None:
            return None
        generation = self.heartbeat.generation
        return StorePeers(name, generation, self.rank, self.world_size, self.timeout_s)

    def close(self) -> None:
        """Stop this rank's heartbeat (the process group stays for a next stage)."""
        if self.heartbeat is not None:
            self.heartbeat.close()

    def failure(self, error: BaseException) -> ArdeaError | None:
        """The error to end this rank with when ``error`` is a failed or timed-out
        collective, naming the ranks that stopped (:mod:`ardea.trainer.watchdog`); None
        for any other error."""
        if self.heartbeat is None or not is_collective_failure(error):
            return None
        return ArdeaError(describe_failure(error, self.heartbeat, self.timeout_s))

    # ---------------------------------------------------------------- sharing
    def share(self, items: list) -> tuple[int, list]:
        """This rank's contiguous share of ``items`` and the index of its first item; the
        shares of ranks 0, 1, ... in order are ``items``."""
        if len(items) % self.world_size:
            raise ConfigError(
                f"trainer.batch_size={len(items)} must be divisible by the number of "
                f"processes ({self.world_size}): each rank takes an equal share"
            )
        size = len(items) // self.world_size
        start = self.rank * size
        return start, items[start : start + size]


def is_main_process() -> bool:
    """Rank 0 of a torchrun launch, or the only process."""
    return not dist.is_initialized() or dist.get_rank() == 0


def decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face model (each becomes one FSDP2 unit)."""
    layers = []
    for sub in module.modules():
        if isinstance(sub, nn.ModuleList) and sub and type(sub[0]).__name__.endswith("Layer"):
            layers.extend(sub)
    return layers


def unwrap(module: nn.Module) -> nn.Module:
    """The model inside a DDP wrapper (FSDP2 modules are their own model)."""
    return module.module if isinstance(module, DistributedDataParallel) else module

"""A trained component: one module a training step trains with its own optimizer.

The policy is always the first; a strategy adds its others (online_ppo: the critic) with
:meth:`~ardea.trainer.strategies.Strategy.trained_components`. The
:class:`~ardea.trainer.step.updates.Updater` treats them all alike: one backward through the
summed loss fills every component's gradients; per optimizer update each is clipped to its
own ``max_grad_norm`` and stepped (none is when the loss or the policy's gradient is not
finite; a component whose own gradient is not finite skips its step); after the step's
updates every schedule advances once. Its metrics are ``<prefix>/grad_norm`` (before
clipping) and ``<prefix>/lr`` (the rate the step's updates used); a checkpoint holds its
optimizer and schedule in the trainer state and, for components other than the policy,
its weights in ``checkpoint_dir`` (written by ``save``, read by ``load``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ardea.errors import ArdeaError
from ardea.trainer.schedule import build_adamw, clip_gradients
from ardea.trainer.state_dicts import (
    gathered_state,
    load_optimizer_state,
    optimizer_groups,
    optimizer_state,
)


@dataclass
class TrainedComponent:
    """A module, its AdamW and schedule, its clipping and where its weights are saved.

    ``prefix``: its metrics' prefix (``train`` for the policy); ``max_grad_norm``: 0 = no
    clipping; ``checkpoint_dir``, ``save(directory, state)``, ``load(directory)``: its
    weights' sub-directory of a checkpoint and how they are written (rank 0, from the whole
    ``state``) and read (every rank) — None for the policy, which the loop saves itself.
    """

    prefix: str
    module: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    max_grad_norm: float = 0.0
    checkpoint_dir: str | None = None
    save: Callable[[Path, dict[str, torch.Tensor]], None] | None = None
    load: Callable[[Path], None] | None = None
    parameters: list[nn.Parameter] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        prefix: str,
        module: nn.Module,
        trainer: Any,
        *,
        lr: float,
        warmup_steps: int,
        max_grad_norm: float,
        **saving: Any,
    ) -> TrainedComponent:
        """``module``'s trainable parameters under AdamW with ``trainer``'s schedule;
        ``saving``: ``checkpoint_dir``, ``save``, ``load``."""
        parameters = [p for p in module.parameters() if p.requires_grad]
        optimizer, scheduler = build_adamw(parameters, trainer, lr=lr, warmup_steps=warmup_steps)
        return cls(
            prefix, module, optimizer, scheduler, max_grad_norm, **saving, parameters=parameters
        )

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def clip(self) -> float:
        """Clip the gradient to ``max_grad_norm``; the norm before clipping."""
        return clip_gradients(self.parameters, self.max_grad_norm or math.inf)

    def step(self) -> float:
        """Clip and step (unless the norm is not finite), then clear; the norm."""
        norm = self.clip()
        if math.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def state_dict(self, *, sharded: bool = False) -> dict[str, Any]:
        """Optimizer state by parameter name (whole: a collective under FSDP2) and the
        schedule; ``sharded``: the hyperparameters alone, the moments being in this rank's
        shard file (:mod:`ardea.trainer.shard_files`; not a collective)."""
        optimizer = optimizer_groups if sharded else optimizer_state
        return {
            "optimizer": optimizer(self.module, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], *, sharded: bool = False) -> None:
        """Load :meth:`state_dict`'s; ``sharded``: its optimizer moments are this rank's
        FSDP2 shards."""
        load_optimizer_state(self.module, self.optimizer, state["optimizer"], sharded=sharded)
        self.scheduler.load_state_dict(state["scheduler"])

    def weights(self, *, keep: bool) -> dict[str, torch.Tensor]:
        """The whole weights for a checkpoint's export, on CPU where ``keep`` (the ranks that
        write one), {} elsewhere (a collective under FSDP2)."""
        return gathered_state(self.module, keep=keep)

    def load_weights(self, checkpoint: Path) -> None:
        """Read its weights from ``checkpoint``; an error names the missing directory."""
        directory = Path(checkpoint) / str(self.checkpoint_dir)
        if not directory.is_dir():
            raise ArdeaError(
                f"checkpoint {checkpoint} has no {self.checkpoint_dir}/ (the {self.prefix} this "
                "run trains); it cannot resume this run without it. Resume from a checkpoint "
                "of a run of the same strategy, or start a new run (trainer.resume=never)."
            )
        self.load(directory)

"""Optimizers and learning-rate schedules (as a multiplier of the peak rate)."""

from __future__ import annotations

import math
from typing import Any

import torch


def lr_multiplier(
    step: int, *, kind: str, warmup_steps: int, total_steps: int, min_ratio: float
) -> float:
    """Factor applied to the peak learning rate before optimizer step ``step`` (0-based).

    Warm-up: ``(step + 1) / warmup_steps`` for ``step < warmup_steps``. Then, with
    ``p = (step - warmup) / max(1, total - warmup)`` in [0, 1]:
    constant → 1; linear → ``1 - (1 - min_ratio)·p``;
    cosine → ``min_ratio + (1 - min_ratio)·½(1 + cos(πp))``.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if kind == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    if kind == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr schedule {kind!r}; choose constant, cosine or linear")


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    kind: str,
    warmup_steps: int,
    total_steps: int,
    min_ratio: float,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` following :func:`lr_multiplier` (its state saves with checkpoints)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_multiplier(
            step, kind=kind, warmup_steps=warmup_steps, total_steps=total_steps, min_ratio=min_ratio
        ),
    )


def build_adamw(
    parameters: list[torch.nn.Parameter], trainer: Any, *, lr: float, warmup_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``parameters`` with ``trainer``'s betas and weight decay, and its schedule
    (``trainer.lr_schedule`` over ``trainer.max_steps`` steps down to ``min_lr_ratio``),
    peaking at ``lr`` after ``warmup_steps``: the policy's and the critic's optimizers."""
    # one fused kernel over all parameters where torch has one (CPU, CUDA): 5x faster than
    # the default per-tensor loop on 10M parameters on a CPU, the same update to float32
    # rounding (benchmarks/README.md)
    fused = bool(parameters) and all(p.device.type in ("cpu", "cuda") for p in parameters)
    optimizer = torch.optim.AdamW(
        parameters, lr=lr, betas=tuple(trainer.adam_betas), weight_decay=trainer.weight_decay,
        fused=fused or None,
    )  # fmt: skip
    scheduler = build_scheduler(
        optimizer,
        kind=trainer.lr_schedule,
        warmup_steps=warmup_steps,
        total_steps=trainer.max_steps,
        min_ratio=trainer.min_lr_ratio,
    )
    return optimizer, scheduler


def clip_gradients(parameters: list[torch.Tensor], max_norm: float) -> float:
    """Clip the global gradient norm of ``parameters`` to ``max_norm``; returns the norm
    before clipping (over all shards of FSDP2's sharded gradients)."""
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    full_tensor = getattr(norm, "full_tensor", None)  # a DTensor under FSDP2
    return float(full_tensor() if callable(full_tensor) else norm)

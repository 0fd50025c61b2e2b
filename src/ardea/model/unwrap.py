"""The transformers model inside the wrappers training puts around it."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel


def unwrap_peft(model: nn.Module) -> nn.Module:
    """The transformers model inside a DDP and/or ``peft`` wrapper (LoRA layers stay in
    it), else ``model``."""
    if isinstance(model, DistributedDataParallel):
        model = model.module
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model

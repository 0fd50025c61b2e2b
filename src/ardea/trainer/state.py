"""What a checkpoint must hold beyond the weights, so a resumed run is the same run.

``trainer_state.pt`` is a dict of tensors and plain Python containers (read back with
``torch.load(weights_only=True)``): the step, optimizer and scheduler states, the data
sampler's position, every RNG (Python, torch CPU, CUDA), and the loop's own counters.
"""

from __future__ import annotations

import random
from typing import Any

import torch


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": _to_lists(random.getstate()),
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch_cpu"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"])


def _to_lists(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_to_lists(v) for v in value]
    return value

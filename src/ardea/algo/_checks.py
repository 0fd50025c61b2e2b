"""Input validation shared by the algorithm functions.

Every public function in :mod:`ardea.algo` checks its tensors with these helpers so that
bad input fails with a message naming the argument and what is wrong (shape, dtype,
non-finite values) instead of producing a silently wrong number.

Checking *values* (NaN/inf, a mask of 0/1) reads the tensors back to the host: a device
sync on a GPU. Inside :func:`trusted_inputs` those checks are skipped (shapes and dtypes
are still checked, which costs nothing): a caller whose tensors were validated where they
were built (the trainer's update loop: batches are checked when made, and a non-finite loss
skips the update) wraps its hot loop in it.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

_TRUST = threading.local()


@contextlib.contextmanager
def trusted_inputs() -> Iterator[None]:
    """Skip the value checks that need a device sync, in this thread (module docstring)."""
    before = getattr(_TRUST, "on", False)
    _TRUST.on = True
    try:
        yield
    finally:
        _TRUST.on = before


def _trusted() -> bool:
    return getattr(_TRUST, "on", False)


def check_tensor(name: str, x: object) -> Tensor:
    """Raise ``TypeError`` unless ``x`` is a tensor; return it."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_float(name: str, x: object) -> Tensor:
    """Raise unless ``x`` is a floating-point tensor."""
    x = check_tensor(name, x)
    if not x.is_floating_point():
        raise TypeError(f"{name} must have a floating-point dtype, got {x.dtype}")
    return x


def check_ndim(name: str, x: Tensor, ndim: int, dims: str) -> None:
    """Raise ``ValueError`` unless ``x`` has ``ndim`` dimensions (``dims`` names them)."""
    if x.dim() != ndim:
        raise ValueError(f"{name} must have shape {dims}, got shape {tuple(x.shape)}")


def check_shape(name: str, x: Tensor, shape: Sequence[int], dims: str) -> None:
    """Raise ``ValueError`` unless ``x.shape == shape`` (``dims`` names the axes)."""
    if tuple(x.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have shape {dims} = {tuple(shape)}, got shape {tuple(x.shape)}"
        )


def check_finite(name: str, x: Tensor, where: Tensor | None = None) -> None:
    """Raise ``ValueError`` if ``x`` holds NaN or +-inf (only where ``where`` is true);
    nothing inside :func:`trusted_inputs`."""
    if x.numel() == 0 or _trusted():
        return
    if where is not None:
        x = torch.where(where, x, 0)
    low, high = torch.aminmax(x.detach())  # one pass; NaN and inf propagate
    if bool(torch.isfinite(low)) and bool(torch.isfinite(high)):
        return
    count = int((~torch.isfinite(x)).sum())
    scope = " at counted positions" if where is not None else ""
    raise ValueError(f"{name} must contain only finite values{scope}; found {count} NaN/inf")


def as_mask(name: str, mask: object, shape: Sequence[int], dims: str) -> Tensor:
    """Validate a 0/1 or boolean mask of ``shape`` and return it as a ``bool`` tensor."""
    mask = check_tensor(name, mask)
    check_shape(name, mask, shape, dims)
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex():
        raise TypeError(f"{name} must be boolean or 0/1, got dtype {mask.dtype}")
    if not _trusted() and bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError(f"{name} must be boolean or contain only 0 and 1")
    return mask != 0


def check_number(name: str, value: object, *, low: float | None = None) -> float:
    """Return ``value`` as a finite float; reject bools, non-numbers and values below ``low``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


def per_row(
    name: str, value: float | Tensor, rows: int, dims: str, *, dtype: torch.dtype, device
) -> Tensor:
    """Broadcast a float or a ``[rows]`` tensor to a ``[rows]`` tensor of ``dtype``."""
    if isinstance(value, Tensor):
        if value.dim() == 0:
            value = value.expand(rows)
        check_shape(name, value, (rows,), dims)
        check_finite(name, value)
        return value.to(device=device, dtype=dtype)
    return torch.full((rows,), check_number(name, value), dtype=dtype, device=device)

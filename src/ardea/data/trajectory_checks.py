"""Validation of a :class:`~ardea.data.TrajectoryBatch` on construction: shapes, dtypes,
masks, turn ids, versions, finiteness; an error names the field and, where it is one row's
fault, the row."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

PINNED_FIELDS = (
    "advantages",
    "returns",
    "old_values",
    "proximal_logprobs",
    "ref_logprobs",
    "process_rewards",
    "teacher_top_ids",
    "teacher_top_logprobs",
)
TOP_FIELDS = {"teacher_top_ids": "int", "teacher_top_logprobs": "float"}  # (N, S, k)


def _fail(field: str, message: str, row: int | None = None) -> ValueError:
    where = f" (row {row})" if row is not None else ""
    return ValueError(f"TrajectoryBatch.{field}: {message}{where}")


def _first_bad_row(bad: Tensor) -> int:
    """The first row with a True entry of ``bad`` (N, ...)."""
    return int(torch.nonzero(bad.reshape(bad.shape[0], -1).any(dim=-1))[0])


def _check_tensor(batch: Any, name: str, shape: tuple, kind: str) -> Tensor:
    x = getattr(batch, name)
    if not isinstance(x, Tensor):
        raise _fail(name, f"must be a tensor, got {type(x).__name__}")
    if tuple(x.shape) != shape:
        dims = {1: "(N,)", 2: "(N, S)", 3: "(N, S, k)"}[len(shape)]
        raise _fail(name, f"must have shape {dims} = {shape}, got {tuple(x.shape)}")
    ok = {
        "int": not x.is_floating_point() and not x.is_complex() and x.dtype != torch.bool,
        "bool": x.dtype == torch.bool,
        "float": x.is_floating_point(),
    }[kind]
    if not ok:
        raise _fail(name, f"must have a {kind} dtype, got {x.dtype}")
    return x


def validate(batch: Any) -> None:
    """Raise ValueError naming the field (and row) of the first problem of ``batch``."""
    ids = batch.input_ids
    if not isinstance(ids, Tensor) or ids.dim() != 2:
        raise _fail("input_ids", f"must be an (N, S) tensor, got {getattr(ids, 'shape', ids)!r}")
    grid, rows = tuple(ids.shape), (ids.shape[0],)
    _check_tensor(batch, "input_ids", grid, "int")
    attention = _check_tensor(batch, "attention_mask", grid, "int")
    if bool(((attention != 0) & (attention != 1)).any()):
        raise _fail("attention_mask", "must contain only 0 and 1")
    if grid[1] > 1 and bool((attention[:, 1:] > attention[:, :-1]).any()):
        row = _first_bad_row(attention[:, 1:] > attention[:, :-1])
        raise _fail("attention_mask", "rows must be right-padded (1s, then 0s)", row)
    trained = _check_tensor(batch, "loss_mask", grid, "bool")
    if bool((trained & (attention == 0)).any()):
        raise _fail(
            "loss_mask", "marks a padding token", _first_bad_row(trained & (attention == 0))
        )
    _check_turn_ids(_check_tensor(batch, "turn_ids", grid, "int"), trained)
    versions = _check_tensor(batch, "versions", grid, "int")
    if bool((versions < -1).any()):
        raise _fail("versions", "must be >= -1 (-1: not generated)", _first_bad_row(versions < -1))
    if batch.logprobs is not None:
        logprobs = _check_tensor(batch, "logprobs", grid, "float")
        bad = trained & ~torch.isfinite(logprobs)
        if bool(bad.any()):
            raise _fail("logprobs", "must be finite on trained tokens", _first_bad_row(bad))
    if batch.position_ids is not None:
        _check_tensor(batch, "position_ids", grid, "int")
    if batch.routed_experts is not None:
        _check_routes(batch.routed_experts, grid)
    rewards = _check_tensor(batch, "rewards", rows, "float")
    if not bool(torch.isfinite(rewards).all()):
        raise _fail("rewards", "must be finite", _first_bad_row(~torch.isfinite(rewards)))
    _check_tensor(batch, "group_ids", rows, "int")
    _check_tensor(batch, "no_eos", rows, "bool")
    if not batch.temperature > 0:
        raise _fail("temperature", f"must be > 0, got {batch.temperature!r}")
    if not (isinstance(batch.top_k, int) and batch.top_k >= 0):
        raise _fail("top_k", f"must be an int >= 0 (0 = off), got {batch.top_k!r}")
    if not 0.0 < batch.top_p <= 1.0:
        raise _fail("top_p", f"must be in (0, 1] (1 = off), got {batch.top_p!r}")
    check_pinned(batch, [name for name in PINNED_FIELDS if getattr(batch, name) is not None])


def check_pinned(batch: Any, names: Any) -> None:
    """Shapes ``(N, S)`` and float dtypes of the pinned fields ``names`` (no device sync);
    the teacher's top tokens ``(N, S, k)`` (ids an integer dtype), both with the same k."""
    grid = tuple(batch.input_ids.shape)
    for name in names:
        if name not in TOP_FIELDS:
            _check_tensor(batch, name, grid, "float")
            continue
        ids, values = batch.teacher_top_ids, batch.teacher_top_logprobs
        if ids is None or values is None:
            raise _fail(name, "teacher_top_ids and teacher_top_logprobs are pinned together")
        k = ids.shape[-1] if ids.dim() == 3 and ids.shape[-1] > 0 else 1
        _check_tensor(batch, name, (*grid, k), TOP_FIELDS[name])


def _check_routes(routes: Any, grid: tuple[int, int]) -> None:
    """``(N, S, L, K)`` integer expert ids, -1 where none."""
    if not isinstance(routes, Tensor) or routes.dim() != 4 or tuple(routes.shape[:2]) != grid:
        shape = tuple(getattr(routes, "shape", ()))
        raise _fail("routed_experts", f"must have shape (N, S, L, K) with (N, S) = {grid}, "
                    f"got {shape}")  # fmt: skip
    if routes.is_floating_point() or routes.dtype == torch.bool:
        raise _fail("routed_experts", f"must have an int dtype, got {routes.dtype}")
    if bool((routes < -1).any()):
        raise _fail("routed_experts", "must be >= -1 (-1: none)", _first_bad_row(routes < -1))


def _check_turn_ids(turn_ids: Tensor, trained: Tensor) -> None:
    """-1 or a turn index; every trained token in a turn; turns never decrease along a row."""
    if bool((turn_ids < -1).any()):
        raise _fail(
            "turn_ids",
            "must be >= -1 (-1: not in an assistant turn)",
            _first_bad_row(turn_ids < -1),
        )
    if bool((trained & (turn_ids < 0)).any()):
        raise _fail(
            "turn_ids", "a trained token has no turn id", _first_bad_row(trained & (turn_ids < 0))
        )
    if turn_ids.shape[1]:
        running = torch.cummax(turn_ids, dim=-1).values
        bad = (turn_ids >= 0) & (turn_ids < running)
        if bool(bad.any()):
            raise _fail("turn_ids", "turn ids must not decrease along a row", _first_bad_row(bad))

"""Compiled C loops for the two sequential parts of GAE, loaded with :mod:`ctypes`.

``ardea_gae_scan``: the backward recurrence of :mod:`ardea.algo._gae_scan`, one row at a
time, with each float operation in the order of the PyTorch loop (compiled with
``-ffp-contract=off`` and without fast-math, so no fused multiply-add changes a rounding).

``ardea_turn_slots``: one forward pass per row that validates active turn ids (negative,
``>= T``, decreasing) and sums each turn's rewards, records its first value and marks it
present -- the PyTorch version needs several full-tensor passes (scatter, cummax) for this.

The source is compiled on first use with the system C compiler (``$CC``, ``cc`` or
``gcc``; no Python headers, no torch headers, well under a second) into
``$ARDEA_KERNEL_CACHE`` or ``~/.cache/ardea/kernels`` (the file name carries a hash of the
source and flags; the file is renamed into place atomically). Without a compiler, or with
``ARDEA_DISABLE_C_KERNEL=1``, :func:`c_kernel_available` is False and the callers use their
PyTorch versions, which compute the same numbers.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch
from torch import Tensor

_SOURCE = r"""
#include <stdint.h>
#define ARDEA_KERNELS(SUFFIX, REAL)                                                   \
void ardea_gae_scan_##SUFFIX(const REAL* r, const REAL* v, const uint8_t* m,        \
        const REAL* next0, const REAL* coef, REAL gamma, REAL* out,                 \
        int64_t rows, int64_t cols) {                                               \
    for (int64_t b = 0; b < rows; ++b) {                                            \
        const REAL* rb = r + b * cols;                                              \
        const REAL* vb = v + b * cols;                                              \
        const uint8_t* mb = m + b * cols;                                           \
        REAL* ob = out + b * cols;                                                  \
        REAL nv = next0[b];                                                         \
        REAL last = 0;                                                              \
        const REAL c = coef[b];                                                     \
        ob[cols - 1] = 0;                                                           \
        for (int64_t t = cols - 2; t >= 0; --t) {                                   \
            if (mb[t]) {                                                            \
                REAL disc_next = gamma * nv;                                        \
                REAL delta = rb[t] + disc_next;                                     \
                delta = delta - vb[t];                                              \
                REAL carried = c * last;                                            \
                last = delta + carried;                                             \
                nv = vb[t];                                                         \
            }                                                                       \
            ob[t] = last;                                                           \
        }                                                                           \
    }                                                                               \
}                                                                                   \
int64_t ardea_turn_slots_##SUFFIX(const REAL* r, const REAL* v, const uint8_t* m,   \
        const int64_t* ids, REAL* slot_r, REAL* slot_v, uint8_t* present,           \
        int64_t rows, int64_t cols) {                                               \
    const int64_t width = cols + 1;                                                 \
    for (int64_t b = 0; b < rows; ++b) {                                            \
        int64_t prev = -1;                                                          \
        REAL* sr = slot_r + b * width;                                              \
        REAL* sv = slot_v + b * width;                                              \
        uint8_t* sp = present + b * width;                                          \
        for (int64_t t = 0; t < cols; ++t) {                                        \
            int64_t i = b * cols + t;                                               \
            if (!m[i]) continue;                                                    \
            int64_t id = ids[i];                                                    \
            if (id < 0) return 1;                                                   \
            if (id >= cols) return 2;                                               \
            if (id < prev) return 3;                                                \
            if (!sp[id]) { sp[id] = 1; sv[id] = v[i]; }                             \
            sr[id] = sr[id] + r[i];                                                 \
            prev = id;                                                              \
        }                                                                           \
    }                                                                               \
    return 0;                                                                       \
}
ARDEA_KERNELS(f32, float)
ARDEA_KERNELS(f64, double)
"""

_CFLAGS = ["-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math"]
_REALS = {torch.float32: ("f32", ctypes.c_float), torch.float64: ("f64", ctypes.c_double)}
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_failed = False


def _compile(target: Path) -> None:
    compiler = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or shutil.which("gcc")]
    if compiler[0] is None:
        raise RuntimeError("no C compiler found")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, out = Path(tmp) / "ardea_kernels.c", Path(tmp) / target.name
        src.write_text(_SOURCE)
        cmd = [*compiler, *_CFLAGS, "-o", str(out), str(src)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        os.replace(out, target)  # atomic: a concurrent process never loads a partial file


def _declare(lib: ctypes.CDLL) -> None:
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    for suffix, real in _REALS.values():
        scan = getattr(lib, f"ardea_gae_scan_{suffix}")
        scan.restype, scan.argtypes = None, [ptr] * 5 + [real, ptr, i64, i64]
        slots = getattr(lib, f"ardea_turn_slots_{suffix}")
        slots.restype, slots.argtypes = i64, [ptr] * 7 + [i64, i64]


def _load() -> ctypes.CDLL | None:
    """Compile (once, cached on disk) and load the kernels; ``None`` when unavailable."""
    global _lib, _failed
    with _lock:
        if _lib is None and not _failed:
            digest = hashlib.sha256((_SOURCE + " ".join(_CFLAGS)).encode()).hexdigest()[:16]
            root = os.environ.get("ARDEA_KERNEL_CACHE") or Path.home() / ".cache/ardea/kernels"
            target = Path(root) / f"ardea_kernels_{digest}.so"
            try:
                if not target.exists():
                    _compile(target)
                lib = ctypes.CDLL(str(target))
                _declare(lib)
                _lib = lib
            except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError):
                _failed = True
    return _lib


def c_kernel_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether the compiled kernels can be used here for tensors of ``dtype``."""
    if os.environ.get("ARDEA_DISABLE_C_KERNEL", "") not in ("", "0"):
        return False
    return dtype in _REALS and _load() is not None


def _cpu(x: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    return x.to(device="cpu", dtype=dtype).contiguous()


def scan_c(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    next_values: Tensor,
    coef: Tensor,
    discount: float,
) -> Tensor:
    """The GAE recurrence in C on ``(M, T)`` inputs (see ``_gae_scan``); same device out."""
    suffix, real = _REALS[rewards.dtype]
    r, v, nv, c = (_cpu(x) for x in (rewards, values, next_values, coef))
    m = _cpu(mask, torch.uint8)
    out = torch.empty_like(r)
    rows, cols = r.shape
    fn = getattr(_load(), f"ardea_gae_scan_{suffix}")
    fn(
        r.data_ptr(),
        v.data_ptr(),
        m.data_ptr(),
        nv.data_ptr(),
        c.data_ptr(),
        real(discount),
        out.data_ptr(),
        rows,
        cols,
    )
    return out.to(rewards.device)


def turn_slots_c(
    rewards: Tensor, values: Tensor, active: Tensor, turn_ids: Tensor
) -> tuple[int, Tensor, Tensor, Tensor]:
    """Per-turn reward sums, first values and presence in ``(M, T + 1)`` slots.

    Returns ``(error, turn_rewards, turn_values, present)``; ``error`` is 0, or 1/2/3 for a
    negative / too large / decreasing active turn id (the slots are then incomplete).
    """
    suffix, _ = _REALS[rewards.dtype]
    r, v = _cpu(rewards), _cpu(values)
    m, ids = _cpu(active, torch.uint8), _cpu(turn_ids, torch.int64)
    rows, cols = r.shape
    slot_r = torch.zeros(rows, cols + 1, dtype=r.dtype)
    slot_v = torch.zeros(rows, cols + 1, dtype=r.dtype)
    present = torch.zeros(rows, cols + 1, dtype=torch.uint8)
    fn = getattr(_load(), f"ardea_turn_slots_{suffix}")
    error = fn(
        r.data_ptr(),
        v.data_ptr(),
        m.data_ptr(),
        ids.data_ptr(),
        slot_r.data_ptr(),
        slot_v.data_ptr(),
        present.data_ptr(),
        rows,
        cols,
    )
    device = rewards.device
    return int(error), slot_r.to(device), slot_v.to(device), present.bool().to(device)

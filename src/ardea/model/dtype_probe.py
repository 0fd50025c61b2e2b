"""Which compute dtype multiplies a run's matrices faster on this machine, measured.

``model.compute_dtype=auto`` cannot be decided from CPU flags: bf16 matmuls ran 2-3x
faster than fp32 on one AVX-512-BF16 CPU without AMX, 1.9-5.5x slower on another with the
same flags, and hundreds of times slower on an AVX2 CPU (emulated). So :func:`probe` times,
at the run's own two shapes and in each candidate dtype, the kernel each phase multiplies
with:

- training: ``tokens × hidden @ hidden × intermediate`` (a micro-batch's MLP projection),
  ``F.linear`` under ``torch.autocast``, as the model's projections run it;
- decode:   ``rows × hidden @ hidden × intermediate`` (one token of every sequence in a
  generation batch), the in-process engine's :class:`~ardea.model.packed_linear.PackedLinear`
  (the weight cast and laid out once, as between two weight updates).

A dtype's *time* is the sum over the two shapes of the seconds one product takes, each
scaled to the same FLOPs (the harmonic mean of its two rates), and the fastest wins. The
parameters' own dtype is always a candidate; a dtype is skipped without its big product
when it is already ``GIVE_UP_RATIO`` times slower on the decode shape (an emulated bf16
product at training shapes can take seconds). Each shape is timed for about
``budget_s / (2 · candidates)`` seconds (at least two products), so a probe costs well
under a second; its result is cached per machine, torch version, thread count and shapes in
``$ARDEA_CACHE_DIR`` (default ``~/.cache/ardea``) as ``compute_dtype_probe.json``. A cached
result is checked by one short timing of the chosen dtype at each shape (a few
milliseconds): when either now runs ``RECHECK_RATIO`` times faster than the cache says, the
cached figures were taken on a busy machine and everything is measured again.

``$ARDEA_AUTO_COMPUTE_DTYPE`` (``bfloat16`` or ``float32``) forces the answer without
measuring, for a whole run and every process it starts: a machine where bf16 is slower can
then run what a machine where it wins would run (the test suite runs its precision-sensitive
tests under both answers this way). A value that is not a candidate is an error naming it.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ardea.errors import ConfigError
from ardea.model.packed_linear import PackedLinear

GIVE_UP_RATIO = 4.0
"""A candidate this many times slower than the parameters' dtype at the decode shape is not
timed at the training shape."""

CACHE_FILE = "compute_dtype_probe.json"

FORCE_ENV = "ARDEA_AUTO_COMPUTE_DTYPE"
"""The environment variable that forces ``auto``'s answer (module docstring)."""

RECHECK_RATIO = 1.5
"""A cached result is measured again when its chosen dtype's decode product now runs this
many times faster than the cache says (module docstring)."""

RECHECK_BUDGET_S = 0.02

MAX_PRODUCT_FLOPS = {"decode": 6.4e7, "train": 2e9}
"""FLOPs one timed product may have: rows are cut to fit (at least one), so a large model's
probe, or an emulated dtype's, stays short. Large enough for the rate's plateau: at 384 ×
1152 on an AVX-512-BF16 Zen 5, bf16 ran 670-680 GFLOP/s at 578 rows (a 5.12e8 budget's cut)
and 850-900 from 1,024 to 8,192 rows; float32 was flat from 578 rows (2,260 rows here)."""


@dataclass(frozen=True)
class ProbeShapes:
    """The matmul shapes a run spends its time in (module docstring)."""

    hidden: int
    intermediate: int
    train_tokens: int
    decode_rows: int

    def flops(self, rows: int) -> float:
        """FLOPs of one ``rows × hidden @ hidden × intermediate`` product."""
        return 2.0 * rows * self.hidden * self.intermediate

    def rows(self, kind: str) -> int:
        """Rows of the timed ``kind`` product (``train`` or ``decode``), cut to
        :data:`MAX_PRODUCT_FLOPS`."""
        wanted = self.train_tokens if kind == "train" else self.decode_rows
        fitting = int(MAX_PRODUCT_FLOPS[kind] // self.flops(1))
        return max(1, min(wanted, fitting))

    def key(self) -> str:
        """The products timed, rows as cut, so a cache entry names what was measured (and
        entries from before the cut was raised, keyed by the uncut rows, are not reused)."""
        train, decode = self.rows("train"), self.rows("decode")
        return f"train {train}x{self.hidden}@{self.hidden}x{self.intermediate}|decode {decode}"


@dataclass(frozen=True)
class ProbeResult:
    """Measured rates in GFLOP/s per dtype name (``None``: given up at the training shape),
    the dtype picked, whether the figures came from the cache, and whether the choice was
    forced by ``$ARDEA_AUTO_COMPUTE_DTYPE`` (then no rates)."""

    choice: str
    train_gflops: dict[str, float | None]
    decode_gflops: dict[str, float]
    cached: bool = False
    forced: bool = False

    def describe(self) -> str:
        """One line for the start of a run: the choice and the rates behind it."""
        if self.forced:
            return f"compute_dtype=auto: {self.choice} (forced by ${FORCE_ENV}; not measured)"
        parts = []
        for name, decode in self.decode_gflops.items():
            train = self.train_gflops.get(name)
            shown = "not timed" if train is None else f"{train:.1f}"
            parts.append(f"{name} {shown} / {decode:.1f}")
        source = " (cached)" if self.cached else ""
        return (
            f"compute_dtype=auto: {self.choice}; GFLOP/s at training / decode shapes: "
            f"{', '.join(parts)}{source}"
        )


def cache_dir() -> Path:
    """``$ARDEA_CACHE_DIR``, else ``$XDG_CACHE_HOME/ardea``, else ``~/.cache/ardea``."""
    if os.environ.get("ARDEA_CACHE_DIR"):
        return Path(os.environ["ARDEA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ardea"


def machine_key(device: torch.device, shapes: ProbeShapes) -> str:
    """What the probe's answer depends on: the processor and the ISA torch uses on it, torch,
    threads and the shapes."""
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:  # the vector ISA torch dispatches to (ATEN_CPU_CAPABILITY can hold it below the CPU's)
        where = f"{_cpu_name()} ({torch.backends.cpu.get_cpu_capability()})"
    threads = torch.get_num_threads()
    kernels = "decode packed"  # what the decode shape times (older entries timed F.linear)
    return f"{device.type}|{where}|torch {torch.__version__}|{threads} threads|{shapes.key()}|{kernels}"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def linear_gflops(
    device: torch.device,
    dtype: torch.dtype,
    params: torch.dtype,
    rows: int,
    hidden: int,
    intermediate: int,
    budget_s: float,
    *,
    packed: bool = False,
) -> float:
    """GFLOP/s of the best-timed product of ``rows × hidden`` inputs by ``intermediate ×
    hidden`` parameters in ``dtype``: ``F.linear`` under autocast to ``dtype`` (none when it
    is the parameters' dtype), or with ``packed`` the engine's :class:`PackedLinear` on the
    weight cast to ``dtype`` once. Timed for ``budget_s`` seconds (at least two products after
    a warm-up). Random numbers come from a generator of its own: the run's seeded streams are
    left as they were."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, hidden, device=device, dtype=params, generator=gen)
    w = torch.randn(intermediate, hidden, device=device, dtype=params, generator=gen)
    autocast = dtype != params and not packed
    product = PackedLinear(w.to(dtype)) if packed else lambda x: F.linear(x, w)
    if packed:
        x = x.to(dtype)
    best, spent, count = float("inf"), 0.0, 0
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=autocast):
        product(x)  # warm-up: kernel selection, oneDNN's first-call work
        while count < 2 or spent < budget_s:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            product(x)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            took = time.perf_counter() - start
            best, spent, count = min(best, took), spent + took, count + 1
    return 2.0 * rows * hidden * intermediate / best / 1e9


def product_rate(device, dtype, params, kind: str, shapes: ProbeShapes, budget_s: float) -> float:
    """:func:`linear_gflops` of the ``kind`` product (rows: :meth:`ProbeShapes.rows`), with
    the engine's packed kernel at the decode shape."""
    rows = shapes.rows(kind)
    return linear_gflops(
        device, dtype, params, rows, shapes.hidden, shapes.intermediate, budget_s,
        packed=kind == "decode",
    )  # fmt: skip


def dtype_rates(
    device: torch.device,
    dtype: torch.dtype,
    params: torch.dtype,
    shapes: ProbeShapes,
    measured: ProbeResult | None = None,
    budget_s: float = 0.2,
    measured_shapes: ProbeShapes | None = None,
) -> dict[str, float]:
    """GFLOP/s of ``dtype`` at the ``train`` and ``decode`` shapes: for each, the probe's
    figure when ``measured`` timed both and at the same rows (``measured_shapes``, default
    ``shapes``), else timed now (``budget_s / 2`` each)."""
    name = str(dtype).removeprefix("torch.")
    probed = measured is not None and measured.train_gflops.get(name) is not None
    figures = {"train": measured.train_gflops, "decode": measured.decode_gflops} if probed else {}
    timed_at = measured_shapes or shapes
    return {
        kind: figures[kind][name]
        if probed and timed_at.rows(kind) == shapes.rows(kind)
        else product_rate(device, dtype, params, kind, shapes, budget_s / 2)
        for kind in ("train", "decode")
    }


def measure(
    device: torch.device,
    params: torch.dtype,
    candidates: list[torch.dtype],
    shapes: ProbeShapes,
    budget_s: float = 0.4,
) -> ProbeResult:
    """Time every candidate at both shapes and pick the fastest (module docstring)."""
    share = budget_s / (2 * len(candidates))
    train: dict[str, float | None] = {}
    decode: dict[str, float] = {}
    cost: dict[str, float] = {}
    base_decode = None
    for dtype in candidates:
        name = str(dtype).removeprefix("torch.")
        decode[name] = product_rate(device, dtype, params, "decode", shapes, share)
        if base_decode is None:
            base_decode = decode[name]
        if decode[name] * GIVE_UP_RATIO < base_decode:
            train[name] = None
            continue
        train[name] = product_rate(device, dtype, params, "train", shapes, share)
        cost[name] = 1.0 / train[name] + 1.0 / decode[name]  # seconds per GFLOP at each shape
    choice = min(cost, key=cost.__getitem__)
    return ProbeResult(choice, train, decode)


def forced_choice(candidates: list[torch.dtype]) -> str | None:
    """The dtype name ``$ARDEA_AUTO_COMPUTE_DTYPE`` forces, or None when it is unset or
    empty.

    Raises:
        ConfigError: a value that is not one of ``candidates``.
    """
    value = os.environ.get(FORCE_ENV, "").strip()
    if not value:
        return None
    names = [str(dtype).removeprefix("torch.") for dtype in candidates]
    if value not in names:
        raise ConfigError(f"{FORCE_ENV}={value!r}; choose one of {', '.join(names)} or unset it")
    return value


def probe(device, params, candidates, shapes: ProbeShapes) -> ProbeResult:
    """:func:`measure`, answered from the cache when this machine already measured these
    shapes (the cache is advisory: an unreadable or unwritable file only costs a probe), or
    the dtype ``$ARDEA_AUTO_COMPUTE_DTYPE`` forces (nothing measured: the profile times its
    floor's rates itself)."""
    forced = forced_choice(candidates)
    if forced is not None:
        return ProbeResult(forced, {}, {}, forced=True)
    path = cache_dir() / CACHE_FILE
    key = machine_key(device, shapes) + "|" + ",".join(map(str, candidates))
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stored = {}
    if not isinstance(stored, dict):
        stored = {}
    cached = _cached_result(stored.get(key))
    if cached is not None and not _taken_under_load(cached, device, params, shapes):
        return cached
    result = measure(device, params, candidates, shapes)
    stored[key] = {k: v for k, v in asdict(result).items() if k not in ("cached", "forced")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(stored, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass
    return result


def _cached_result(entry) -> ProbeResult | None:
    try:
        return ProbeResult(**{**entry, "cached": True}) if isinstance(entry, dict) else None
    except TypeError:
        return None


def _taken_under_load(cached: ProbeResult, device, params, shapes: ProbeShapes) -> bool:
    """Whether the chosen dtype's product at either shape now runs :data:`RECHECK_RATIO`
    times faster than ``cached`` says (then the cache was written while something else ran:
    its rates would also inflate every later run's floor)."""
    dtype = getattr(torch, cached.choice, None)
    stored = {
        "decode": cached.decode_gflops.get(cached.choice),
        "train": cached.train_gflops.get(cached.choice),
    }
    if not isinstance(dtype, torch.dtype) or not all(stored.values()):
        return True  # an entry that cannot be checked is measured again
    return any(
        product_rate(device, dtype, params, kind, shapes, RECHECK_BUDGET_S / 2)
        > RECHECK_RATIO * rate
        for kind, rate in stored.items()
    )

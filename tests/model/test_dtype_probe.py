"""compute_dtype=auto decided by measuring the run's matmul shapes in each dtype."""

import json

import pytest
import torch

import ardea.model.dtype_probe as dtype_probe
from ardea.errors import ConfigError
from ardea.model import Precision
from ardea.model.dtype_probe import FORCE_ENV, MAX_PRODUCT_FLOPS, ProbeShapes, measure, probe

CPU = torch.device("cpu")
SHAPES = ProbeShapes(hidden=64, intermediate=192, train_tokens=512, decode_rows=32)


@pytest.fixture(autouse=True)
def _measured(monkeypatch):
    """These tests are of the measurement: whatever answer the suite forces, none here."""
    monkeypatch.delenv(FORCE_ENV, raising=False)


class FakeClock:
    """A clock that the probe's products (F.linear at the training shape, the engine's
    packed linear at the decode shape) advance by FLOPs / rate, the rate depending on the
    dtype (bf16 autocast on, or the packed weight's dtype) and on the product's rows (train-
    or decode-sized): the probe's timings, set by hand."""

    def __init__(self, rates):  # {(dtype name, "train"|"decode"): GFLOP/s}
        self.rates, self.now, self.products, self.kernels = rates, 0.0, [], set()

    def perf_counter(self):
        return self.now

    def linear(self, x, w):
        bf16 = torch.is_autocast_enabled("cpu")
        self.kernels.add(("F.linear", "decode" if x.shape[0] == SHAPES.rows("decode") else "train"))
        return self.advance("bfloat16" if bf16 else "float32", x, w)

    def packed(self, w):
        def product(x):
            kind = "decode" if x.shape[0] == SHAPES.rows("decode") else "train"
            self.kernels.add(("packed", kind))
            return self.advance(str(w.dtype).removeprefix("torch."), x, w)

        return product

    def advance(self, name, x, w):
        kind = "decode" if x.shape[0] == SHAPES.rows("decode") else "train"
        self.products.append((name, kind))
        self.now += 2.0 * x.shape[0] * x.shape[1] * w.shape[0] / (self.rates[name, kind] * 1e9)
        return x.new_empty(x.shape[0], w.shape[0])  # no real product: the clock says its time


@pytest.fixture
def clock(monkeypatch, tmp_path):
    monkeypatch.setenv("ARDEA_CACHE_DIR", str(tmp_path))

    def install(rates):
        fake = FakeClock(rates)
        monkeypatch.setattr(dtype_probe.time, "perf_counter", fake.perf_counter)
        monkeypatch.setattr(dtype_probe.F, "linear", fake.linear)
        monkeypatch.setattr(dtype_probe, "PackedLinear", fake.packed)
        return fake

    return install


def _auto(shapes=SHAPES):
    return Precision.resolve("auto", CPU, torch.float32, shapes=shapes)


def test_auto_takes_bfloat16_where_it_measured_faster(clock):
    clock({("float32", "train"): 100.0, ("float32", "decode"): 90.0,
           ("bfloat16", "train"): 200.0, ("bfloat16", "decode"): 280.0})  # fmt: skip
    precision = _auto()
    assert precision.compute == torch.bfloat16
    assert precision.probe.choice == "bfloat16"
    # the rates come back from the timings: FLOPs / seconds of the best product
    assert precision.probe.train_gflops == pytest.approx({"float32": 100.0, "bfloat16": 200.0})
    assert precision.probe.decode_gflops == pytest.approx({"float32": 90.0, "bfloat16": 280.0})


def test_auto_keeps_float32_where_bfloat16_measured_slower(clock):
    clock({("float32", "train"): 100.0, ("float32", "decode"): 90.0,
           ("bfloat16", "train"): 60.0, ("bfloat16", "decode"): 50.0})  # fmt: skip
    assert _auto().compute == torch.float32


def test_the_choice_weighs_both_shapes(clock):
    """bf16 2x faster in training but 3x slower in decode: per GFLOP 1/200 + 3/90 >
    1/100 + 1/90 seconds, so float32 (the harmonic mean of the two rates decides)."""
    clock({("float32", "train"): 100.0, ("float32", "decode"): 90.0,
           ("bfloat16", "train"): 200.0, ("bfloat16", "decode"): 30.0})  # fmt: skip
    assert _auto().compute == torch.float32


def test_a_dtype_far_slower_at_decode_is_not_timed_at_training_shapes(clock):
    fake = clock({("float32", "train"): 100.0, ("float32", "decode"): 90.0,
                  ("bfloat16", "train"): 1e-3, ("bfloat16", "decode"): 0.5})  # fmt: skip
    precision = _auto()
    assert precision.compute == torch.float32
    assert precision.probe.train_gflops["bfloat16"] is None
    assert ("bfloat16", "train") not in fake.products
    assert "bfloat16 not timed / 0.5" in precision.probe.describe()


def test_the_measurement_is_cached_per_machine_and_shapes(clock, tmp_path):
    rates = {("float32", "train"): 100.0, ("float32", "decode"): 90.0,
             ("bfloat16", "train"): 200.0, ("bfloat16", "decode"): 280.0}  # fmt: skip
    fake = clock(rates)
    first = _auto()
    timed = len(fake.products)
    assert not first.probe.cached and timed >= 8  # warm-up + at least 2 per shape and dtype
    again = _auto()
    assert again.probe.cached and again.probe.train_gflops == first.probe.train_gflops
    # the cache is only checked: the chosen dtype's two products, nothing else
    assert set(fake.products[timed:]) == {("bfloat16", "decode"), ("bfloat16", "train")}
    timed = len(fake.products)
    stored = json.loads((tmp_path / "compute_dtype_probe.json").read_text())
    (key,) = stored
    assert "train 512x64@64x192|decode 32" in key  # the shapes are in the key
    assert f"torch {torch.__version__}" in key and "1 threads" in key
    assert f"({torch.backends.cpu.get_cpu_capability()})" in key  # AVX2-capped: another entry
    _auto(ProbeShapes(64, 192, 1024, 32))  # other shapes: measured again
    assert len(fake.products) > timed
    (tmp_path / "compute_dtype_probe.json").write_text("not json")  # a broken cache: re-measured
    assert not _auto().probe.cached


def test_a_cache_written_on_a_busy_machine_is_measured_again(clock, tmp_path):
    """Cached at a third of the machine's speed (other jobs ran): the check now times the
    chosen dtype's decode product 3x faster than stored, above RECHECK_RATIO 1.5, so the
    whole probe runs again and the quiet figures replace the busy ones. Slower now than
    cached (a busy machine checking a quiet cache) keeps the cache."""
    busy = {("float32", "train"): 30.0, ("float32", "decode"): 30.0,
            ("bfloat16", "train"): 1e-3, ("bfloat16", "decode"): 1.0}  # fmt: skip
    clock(busy)
    assert _auto().probe.decode_gflops["float32"] == pytest.approx(30.0)
    quiet = {**busy, ("float32", "train"): 90.0, ("float32", "decode"): 90.0}
    clock(quiet)
    again = _auto()
    assert not again.probe.cached
    assert again.probe.decode_gflops["float32"] == pytest.approx(90.0)
    stored = json.loads((tmp_path / "compute_dtype_probe.json").read_text())
    (entry,) = stored.values()
    assert entry["decode_gflops"]["float32"] == pytest.approx(90.0)
    fake = clock(busy)  # loaded again: the quiet cache stays
    kept = _auto()
    assert kept.probe.cached and kept.probe.decode_gflops["float32"] == pytest.approx(90.0)
    assert set(fake.products) == {("float32", "decode"), ("float32", "train")}


def test_a_cache_whose_training_rate_was_taken_under_load_is_measured_again(clock, tmp_path):
    """The decode rate cached right, the training rate at half the machine's speed (the
    floor of every later run would be twice too long): the check at the training shape
    finds it 2x faster, above RECHECK_RATIO, and the probe runs again."""
    rates = {("float32", "train"): 100.0, ("float32", "decode"): 80.0,
             ("bfloat16", "train"): 300.0, ("bfloat16", "decode"): 200.0}  # fmt: skip
    clock({**rates, ("bfloat16", "train"): 150.0})
    assert _auto().probe.train_gflops["bfloat16"] == pytest.approx(150.0)
    clock(rates)
    again = _auto()
    assert not again.probe.cached and again.probe.train_gflops["bfloat16"] == pytest.approx(300.0)


def test_rows_are_cut_to_the_product_budget():
    big = ProbeShapes(hidden=4096, intermediate=11008, train_tokens=65536, decode_rows=256)
    per_row = 2 * 4096 * 11008
    assert big.rows("train") == int(MAX_PRODUCT_FLOPS["train"] // per_row) == 22
    assert big.rows("decode") == 1  # one row is more than the budget: never fewer than one
    assert SHAPES.rows("train") == 512 and SHAPES.rows("decode") == 32
    # the 10M benchmark workload's shapes: 2e9 // (2 · 384 · 1152) = 2,260 rows timed
    ten_m = ProbeShapes(hidden=384, intermediate=1152, train_tokens=8192, decode_rows=64)
    assert ten_m.key() == "train 2260x384@384x1152|decode 64"


def test_only_float32_parameters_are_probed_and_shapes_are_needed(clock):
    fake = clock({})
    assert Precision.resolve("auto", CPU, torch.bfloat16, shapes=SHAPES).probe is None
    assert fake.products == []
    with pytest.raises(ValueError, match="needs the run's matmul shapes"):
        Precision.resolve("auto", CPU, torch.float32)
    assert Precision.resolve("float32", CPU, torch.float32).probe is None


def test_every_rank_takes_rank_zeros_measurement(clock):
    clock({("float32", "train"): 100.0, ("float32", "decode"): 90.0,
           ("bfloat16", "train"): 60.0, ("bfloat16", "decode"): 50.0})  # fmt: skip
    rank_zero = dtype_probe.ProbeResult("bfloat16", {"bfloat16": 1.0}, {"bfloat16": 1.0})
    precision = Precision.resolve(
        "auto", CPU, torch.float32, shapes=SHAPES, agree=lambda mine: rank_zero
    )
    assert precision.compute == torch.bfloat16 and precision.probe is rank_zero


def test_a_real_probe_is_short_and_leaves_the_seeded_streams_alone(monkeypatch, tmp_path):
    """On this machine, unpatched: positive rates, well under a second per dtype, and the
    global generator where it was (runs stay reproducible whether the probe ran or not)."""
    import time

    monkeypatch.setenv("ARDEA_CACHE_DIR", str(tmp_path))
    torch.manual_seed(3)
    before = torch.get_rng_state()
    start = time.perf_counter()
    result = measure(CPU, torch.float32, [torch.float32, torch.bfloat16], SHAPES, budget_s=0.2)
    # 4 timed shapes × (warm-up + at least 2 products) of at most 64 MFLOP, plus the budget
    assert time.perf_counter() - start < 10.0
    assert torch.equal(torch.get_rng_state(), before)
    assert result.choice in ("float32", "bfloat16")
    assert all(rate > 0 for rate in result.decode_gflops.values())
    assert result.train_gflops["float32"] > 0
    assert probe(CPU, torch.float32, [torch.float32], SHAPES).choice == "float32"


def test_each_shape_times_the_kernel_its_phase_runs(clock):
    """Training forwards run F.linear under autocast; the engine's decode step multiplies
    with weights packed once (ardea.model.packed_linear): each shape is timed with its own."""
    fake = clock({("float32", "train"): 100, ("float32", "decode"): 80,
                  ("bfloat16", "train"): 300, ("bfloat16", "decode"): 200})  # fmt: skip
    measure(CPU, torch.float32, [torch.float32, torch.bfloat16], SHAPES)
    assert fake.kernels == {("F.linear", "train"), ("packed", "decode")}


@pytest.mark.parametrize("forced", ["bfloat16", "float32"])
def test_the_environment_forces_autos_answer_without_measuring(clock, monkeypatch, forced):
    """$ARDEA_AUTO_COMPUTE_DTYPE answers ``auto`` whatever the rates (here bf16 3x faster,
    so float32 is the answer the probe would not give): nothing is timed or cached, the
    start line says where the answer came from, and an explicit compute_dtype ignores it."""
    fake = clock({("float32", "train"): 100.0, ("float32", "decode"): 100.0,
                  ("bfloat16", "train"): 300.0, ("bfloat16", "decode"): 300.0})  # fmt: skip
    monkeypatch.setenv(FORCE_ENV, forced)
    precision = Precision.resolve("auto", CPU, torch.float32, shapes=SHAPES)
    assert precision.compute == getattr(torch, forced)
    assert precision.probe.forced and not fake.products
    assert precision.probe.describe() == (
        f"compute_dtype=auto: {forced} (forced by ${FORCE_ENV}; not measured)"
    )
    assert not list(dtype_probe.cache_dir().glob("*"))  # a forced answer is not cached
    named = Precision.resolve("float32", CPU, torch.float32, shapes=SHAPES)
    assert named.compute == torch.float32 and named.probe is None


def test_a_forced_answer_that_is_not_a_candidate_is_an_error(clock, monkeypatch):
    fake = clock({("float32", "train"): 100.0, ("float32", "decode"): 100.0,
                  ("bfloat16", "train"): 300.0, ("bfloat16", "decode"): 300.0})  # fmt: skip
    monkeypatch.setenv(FORCE_ENV, "float16")
    with pytest.raises(ConfigError, match=r"ARDEA_AUTO_COMPUTE_DTYPE='float16'; choose one of float32, bfloat16"):  # fmt: skip
        Precision.resolve("auto", CPU, torch.float32, shapes=SHAPES)
    monkeypatch.setenv(FORCE_ENV, "")  # empty: as if unset, so measured
    measured = Precision.resolve("auto", CPU, torch.float32, shapes=SHAPES)
    assert measured.compute == torch.bfloat16 and not measured.probe.forced and fake.products

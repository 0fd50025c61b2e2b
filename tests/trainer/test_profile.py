"""The profile of a run's steps: seconds per phase, their shares, what no phase covers, and
the floor: the counted FLOPs at the measured rates."""

import json

import pytest
import torch

from ardea.config import load_config
from ardea.model import Precision
from ardea.model.dtype_probe import ProbeResult, ProbeShapes
from ardea.trainer import Trainer
from ardea.trainer.profile import StepProfile, print_profile

SHAPES = ProbeShapes(hidden=16, intermediate=32, train_tokens=64, decode_rows=4)


def test_profile_by_hand():
    profile = StepProfile()
    profile.add({"perf/time_generate": 0.5, "perf/time_forward_backward": 0.3, "x": 9.0}, 1.0)
    profile.add({"perf/time_generate": 0.3, "perf/time_forward_backward": 0.5}, 1.0)
    summary = profile.summary()
    assert summary["steps"] == 2 and summary["seconds_per_step"] == 1.0
    assert summary["phases"]["generate"] == {"seconds_per_step": 0.4, "share": 0.4}
    assert summary["phases"]["forward_backward"] == {"seconds_per_step": 0.4, "share": 0.4}
    assert summary["phases"]["other"] == {"seconds_per_step": 0.2, "share": 0.2}
    assert StepProfile().summary() == {}


def test_floor_by_hand(capsys):
    """Per step 4 GFLOP of training at 10 GFLOP/s (0.4 s) and 1 of decoding at 5 (0.2 s):
    a 0.6 s floor in 2 s steps is 30 %; the decode floor in a 0.5 s generate phase 40 %."""
    profile = StepProfile(SHAPES)
    for _ in range(2):
        profile.add({"perf/time_generate": 0.5}, 2.0, {"train": 4e9, "decode": 1e9})
    summary = profile.summary({"train": 10.0, "decode": 5.0})
    assert summary["floor"] == {
        "train_gflop_per_step": 4.0,
        "decode_gflop_per_step": 1.0,
        "rates_gflops": {"train": 10.0, "decode": 5.0},
        "seconds_per_step": 0.6,
        "percent_of_step": 30.0,
        "decode_percent_of_generate": 40.0,
    }
    print_profile(summary)
    assert "floor: 0.6000 s per step = 30.0 % of the step" in capsys.readouterr().out
    assert "floor" not in profile.summary()


def test_floor_rates_are_the_probes_or_measured():
    cpu, f32 = torch.device("cpu"), torch.float32
    probed = ProbeResult("float32", {"float32": 30.0, "bfloat16": None}, {"float32": 20.0})
    profile = StepProfile(SHAPES)
    assert profile.rates(Precision(cpu, f32, f32, probe=probed)) is None  # no step yet
    profile.add({}, 1.0, {"train": 1e9, "decode": 0.0})
    probes = {"train": 30.0, "decode": 20.0, "train_rows": 64}  # rows unknown: the probe's
    assert profile.rates(Precision(cpu, f32, f32, probe=probed)) == probes
    measured = profile.rates(Precision(cpu, f32, f32))  # compute_dtype=float32: timed now
    assert set(measured) == {"train", "decode", "train_rows"} and min(measured.values()) > 0


def test_the_training_rate_is_timed_at_the_rows_the_run_multiplied(monkeypatch):
    """The probe timed 64-row training products; the run's forwards averaged (3·200 +
    1·40) / 4 = 160 rows (a backward-recorded forward counts three passes), so the training
    rate is timed again at 160 rows; the decode rate stays the probe's."""
    import ardea.model.dtype_probe as dtype_probe

    timed = []

    def product_rate(device, dtype, params, kind, shapes, budget_s):
        timed.append((kind, shapes.rows(kind)))
        return 55.0

    monkeypatch.setattr(dtype_probe, "product_rate", product_rate)
    cpu, f32 = torch.device("cpu"), torch.float32
    probed = ProbeResult("float32", {"float32": 30.0, "bfloat16": None}, {"float32": 20.0})
    profile = StepProfile(SHAPES)
    rows = {"train_rows": 3 * 200 + 40, "train_passes": 4}
    profile.add({}, 1.0, {"train": 1e9, "decode": 1e9, **rows})
    rates = profile.rates(Precision(cpu, f32, f32, probe=probed))
    assert rates == {"train": 55.0, "decode": 20.0, "train_rows": 160}
    assert timed == [("train", 160)]
    assert profile.summary(rates)["floor"]["train_rows"] == 160
    assert StepProfile().rates(Precision(cpu, f32, f32)) is None  # no shapes, no floor


def test_an_online_run_writes_its_profile(tmp_path, reward_module):
    from online_testing import RUN

    trainer = Trainer(
        load_config(None, [*RUN, "trainer.max_steps=3", f"trainer.output_dir={tmp_path}"])
    )
    trainer.train()
    profile = json.loads((tmp_path / "results.json").read_text())["profile"]
    assert profile["steps"] == 3
    names = set(profile["phases"])
    assert {
        "generate",
        "score",
        "advantages",
        "forward_backward",
        "optimizer",
        "weight_sync",
    } <= names
    assert sum(p["share"] for p in profile["phases"].values()) == pytest.approx(1.0, abs=1e-3)
    assert profile["seconds_per_step"] == pytest.approx(trainer.train_seconds / 3, rel=1e-3)
    floor = profile["floor"]  # counted work: rollouts decoded in process, PPO forwards
    assert floor["decode_gflop_per_step"] > 0 and floor["train_gflop_per_step"] > 0
    assert 0 < floor["percent_of_step"] < 100
    assert 0 < floor["decode_percent_of_generate"] < 100

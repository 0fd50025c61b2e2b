"""Every strategy, full weights and LoRA, checkpoints and resumes under ``torchrun
--nproc-per-node 2`` with FSDP2 and with DDP (every_strategy.py's ``UNDER``), and its first
step is the one-process step (every_strategy.py runs them: one launch for all the
two-process runs, to pay the start-up once).

- **Checkpoints**: each run evaluates before step 1 and at the end and keeps the best
  checkpoint (a forward without a backward before a save: where FSDP2 could not name the
  optimizer's parameters), saves after every step (a LoRA critic merged for export: where
  FSDP2 refused to copy it), and every checkpoint is complete.
- **Resume**: step 2 run again from the step-1 checkpoint, at the same world size and mode,
  writes the step-2 checkpoint bit for bit: the same state, the same data and rollout, the
  same reductions in the same order.
- **World size**: the first step at two processes (full weights) against one process from
  the same weights: the rollout's metrics are equal (each rank generates its share of the
  rows, each seeded by its global row), the gradients equal up to float32 summation order (test_torchrun.py's
  bound), and every other metric of the step is the same number up to that rounding:
  ``train/*`` metrics are whole-step values (summed over ranks), never one rank's share.
  This is what docs/howto/torchrun.md promises; a metric that depends on the world size
  would fail here.

Cost: about 100 s on a 2-core machine alone (15 s of it the one-process runs, the rest the
two-process launch, about 1.3 s a run).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from numerics import decoder_gradient_terms, gamma
from run_metrics import assert_same_step_metrics
from safetensors.torch import load_file
from test_torchrun import (
    MODEL,
    assert_same_gradients,
    modules,
    one_and_two_processes,
)

from ardea.trainer.checkpoint import checkpoint_problem, list_checkpoints

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
SCRIPT = str(HERE / "every_strategy.py")
sys.path.insert(0, str(HERE))
from every_strategy import ALGOS, MODES, UNDER  # noqa: E402

#: the largest step here: 16 rows (4 offline groups of 4 completions, or 4 prompts with 4
#: samples each) of at most 256 tokens (data.max_length): test_torchrun.py's derivation
RTOL = gamma(decoder_gradient_terms(MODEL, rows=16, span=256))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return one_and_two_processes(SCRIPT, tmp_path_factory.mktemp("every_strategy"), timeout=900)


def tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Every safetensors tensor of a checkpoint, by file and name."""
    out = {}
    for file in sorted(checkpoint.rglob("*.safetensors")):
        for name, value in load_file(str(file)).items():
            out[f"{file.relative_to(checkpoint)}:{name}"] = value
    return out


@pytest.mark.parametrize(("case", "mode"), [(c, m) for m in MODES for c in UNDER[m]])
def test_a_strategy_checkpoints_and_resumes_exactly_under_torchrun(runs, case, mode):
    run_dir, resumed = runs / "2" / mode / case, runs / "2" / mode / f"{case}_resumed"
    saved = list_checkpoints(run_dir)
    assert [p.name for p in saved] == ["step_0000001", "step_0000002"]
    assert all(checkpoint_problem(p) is None for p in saved)
    # the best checkpoint, where the evaluation has a score to keep the best of (accuracy)
    scored = "eval/accuracy" in (run_dir / "metrics.jsonl").read_text()
    assert (run_dir / "checkpoints" / "best").is_dir() == scored
    (last,) = [p for p in list_checkpoints(resumed) if p.name == "step_0000002"]
    expected, got = tensors(saved[-1]), tensors(last)
    assert expected and expected.keys() == got.keys()
    different = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not different, different[:5]
    if case.endswith("_lora"):  # the adapter beside the merged model
        assert any(k.startswith("adapter/") for k in expected)


@pytest.mark.parametrize(("algo", "mode"), [(a, m) for m in MODES for a in ALGOS if a in UNDER[m]])
def test_the_first_step_is_the_same_at_any_world_size(runs, algo, mode):
    one, two = runs / "1" / algo, runs / "2" / mode / algo
    for module in modules(algo):
        assert_same_gradients(one, two, module, 1, rtol=RTOL)
    assert_same_step_metrics(one, two, 1, RTOL)

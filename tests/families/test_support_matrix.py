"""The support matrix (docs/reference/models.md, generated from model_families.py): every
family × every column, run on a tiny random model of the family saved with
``save_pretrained`` and trained through ``model.path`` as a user's checkpoint is.

A ✓ cell trains two steps (finite loss, a gradient); online cells' behaviour log-probs
equal the trainer's within the float32 bound (``mismatch/abs_diff_max`` ≤ 1e-5); the online
GRPO cell's saved ``policy/`` loads with plain transformers and greedy-decodes what ardea's
engine decodes. A refusal cell is refused with an error naming why. The continuous-batching
column samples with rows joining a running batch and checks every completion against one
full forward of its row; the torchrun column runs every family's online GRPO under DDP in
one launch.

Cost: about 60 s of worker time for the in-process cells (72 runs of two steps, 0.6 s each),
1 s for continuous batching, about 40 s for the torchrun launch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from matrix_cells import CELLS, check_engine, check_export, check_steps, run_cell
from model_families import FAMILIES, expected, lora_targets, save_family

from ardea.errors import ConfigError
from ardea.model import build_char_tokenizer

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
TOKENIZER = build_char_tokenizer(model_max_length=256)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {family: save_family(family, root / family) for family in FAMILIES}


def _extra(family: str, cell: str) -> list[str]:
    if cell != "lora":
        return []
    return ["model.lora_target_modules=[" + ", ".join(lora_targets(family)) + "]"]


@pytest.mark.parametrize(("family", "cell"), [(f, c) for f in FAMILIES for c in CELLS])
def test_a_family_trains_with_a_strategy_or_is_refused_by_name(models, tmp_path, family, cell):
    refusal = expected(family, cell)
    if refusal is not None:
        with pytest.raises(ConfigError, match=refusal[1]):
            run_cell(models[family], cell, tmp_path, _extra(family, cell))
        return
    steps = run_cell(models[family], cell, tmp_path, _extra(family, cell))
    check_steps(steps, online=cell not in ("sft", "dpo"))
    if cell == "grpo":
        check_export(tmp_path, TOKENIZER)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_decodes_with_continuous_batching(models, family):
    check_engine(models[family], TOKENIZER)


def test_every_family_trains_under_torchrun(models, tmp_path):
    families = [f for f in FAMILIES if expected(f, "torchrun") is None]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(HERE / "torchrun_families.py"), str(tmp_path),
               str(next(iter(models.values())).parent), *families]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for family in families:
        error = tmp_path / family / "error.txt"
        assert not error.exists(), f"{family}: {error.read_text()[-2000:]}"
        records = (tmp_path / family / "metrics.jsonl").read_text().splitlines()
        steps = [r for r in map(json.loads, records) if "train/loss" in r]
        check_steps(steps, online=True)

"""LoRA with every strategy: two optimizer steps of each through ``ardea train`` with
``model.lora_r=4``; only the adapters train (and a reward model's score head), and each
checkpoint holds the adapter beside the merged model."""

import json

import pytest
from safetensors.torch import load_file
from tiny_models import SMALLEST_OVERRIDES

from ardea.cli.main import main
from ardea.trainer.strategies import strategy_names

TASK = ["data.task=arithmetic", "data.task_args={digits: 2}"]
DATA = {  # strategies whose samples a task does not make: the shipped example files
    "seq": ["data.task=null", "data.path=examples/data/text.jsonl"],
    "grpo": [*TASK, "data.path=examples/data/groups.jsonl"],
}
SMOKE = [
    *SMALLEST_OVERRIDES,
    "model.lora_r=4",
    "model.lora_alpha=8",
    "trainer.max_steps=2",
    "trainer.batch_size=4",
    "trainer.warmup_steps=1",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "data.train_size=40",
    "data.eval_size=4",
    "rollout.group_size=2",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.report=false",  # no report.png: half a second a run
]


@pytest.mark.parametrize("name", strategy_names())
def test_every_strategy_trains_adapters_only(name, tmp_path, monkeypatch):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).parents[2])  # the example files
    overrides = [f"algo.name={name}", *DATA.get(name, TASK), *SMOKE]
    assert main(["train", "--recipe", "none", *overrides, f"trainer.output_dir={tmp_path}"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["steps"] == 2
    # rank 4 on a 1-layer model with hidden size 32: the adapters are a few percent of it
    assert 0 < results["trainable_parameters"] < 0.1 * results["parameters"], results
    adapter = tmp_path / "checkpoints" / "step_0000002" / "adapter" / "adapter_model.safetensors"
    names = set(load_file(adapter))
    assert any("lora_A" in n for n in names) and any("lora_B" in n for n in names)


def test_background_rollouts_of_a_lora_policy(tmp_path, monkeypatch):
    """The background worker's engine holds its own copy of the policy; each publish sends
    it the adapters alone, and its rollouts stay within the staleness bound."""
    monkeypatch.chdir(__import__("pathlib").Path(__file__).parents[2])
    overrides = ["algo.name=online_grpo", *TASK, *SMOKE, "rollout.max_staleness=1",
                 "trainer.max_steps=3", "logging.log_every=1"]  # fmt: skip
    assert main(["train", "--recipe", "none", *overrides, f"trainer.output_dir={tmp_path}"]) == 0
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if "train/loss" in r]
    assert len(steps) == 3 and all(s["rollout/staleness"] <= 1 for s in steps)

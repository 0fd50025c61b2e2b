"""Every shipped config runs two optimizer steps through the `ardea train` command
(in-process, so the suite does not pay an interpreter start per config)."""

import json
import re
from pathlib import Path

import pytest
import torch
from tiny_models import SMALLEST_OVERRIDES, smallest_model
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)

from ardea.cli.main import main
from ardea.config import load_config, stage_configs
from ardea.model import build_char_tokenizer

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))
SMOKE = [
    "trainer.max_steps=2",
    "trainer.batch_size=4",
    "trainer.grad_accum_steps=2",
    "trainer.warmup_steps=1",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "data.eval_size=4",
    "data.train_size=40",
    *SMALLEST_OVERRIDES,
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.report=false",  # no report.png: half a second a run
]


def test_configs_are_shipped():
    names = {p.stem for p in CONFIGS}
    assert {"sft_arithmetic", "sft_chat", "seq_text", "dpo", "grpo_offline", "sft_lora"} <= names
    assert {"online_grpo", "online_dpo", "online_grpo_dapo"} <= names
    assert {"online_ppo", "online_ppo_adaptive_lambda"} <= names
    assert {"agent_guess_number", "agent_calculator", "agent_guess_number_openai"} <= names


#: a checkpoint of the default recipe's run that a config names (a distillation teacher)
DEFAULT_RUN_CHECKPOINT = re.compile(r"runs/default/\w+/checkpoints/step_\d+/policy")


def working_directory(path: Path, tmp_path: Path) -> Path:
    """Where ``path`` runs: the repository (configs name files relative to it), or, for a
    config that names the default run's checkpoints, a copy of its layout holding a
    smallest model with the policy's tokenizer at each of them."""
    repo = Path(__file__).parent.parent
    named = DEFAULT_RUN_CHECKPOINT.findall(path.read_text())
    if not named:
        return repo
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("configs", "examples"):
        (root / name).symlink_to(repo / name)
    tokenizer = build_char_tokenizer()
    for checkpoint in named:
        smallest_model(tokenizer).save_pretrained(root / checkpoint)
        tokenizer.save_pretrained(root / checkpoint)
    return root


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_smoke_runs(path, tmp_path, monkeypatch):
    monkeypatch.chdir(working_directory(path, tmp_path))
    config = load_config(path, [*SMOKE, f"trainer.output_dir={tmp_path}"])
    assert main(["train", str(path), *SMOKE, f"trainer.output_dir={tmp_path}"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    if config.stages:  # a staged config: every stage ran; the last one's policy is checked
        *_, last = config.stages
        assert results["stages"] == list(config.stages)
        assert all(results[name]["steps"] == 2 for name in config.stages)
        config, tmp_path, results = stage_configs(config)[-1][1], tmp_path / last, results[last]
    assert results["steps"] == 2 and results["strategy"] == config.algo.name
    policy = tmp_path / "checkpoints" / "step_0000002" / "policy"
    # the checkpoint of every strategy is a plain Hugging Face model directory (a reward
    # model's a sequence classifier of one label)
    scorer = config.algo.name == "reward_model"
    auto = AutoModelForSequenceClassification if scorer else AutoModelForCausalLM
    model = auto.from_pretrained(policy)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    ids = tokenizer("12+34=", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all() and (logits.shape == (1, 1)) == scorer
    critic = policy.parent / "critic"
    assert critic.is_dir() == (config.algo.name == "online_ppo")
    if critic.is_dir():  # the PPO critic is a plain token-classification checkpoint too
        values = AutoModelForTokenClassification.from_pretrained(critic)(ids).logits
        assert values.shape == (1, ids.shape[1], 1) and torch.isfinite(values).all()

"""Every shipped config runs two optimizer steps through the `ardea train` command
(in-process, so the suite does not pay an interpreter start per config), and every metric
those runs log is documented in docs/reference/metrics.md."""

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

#: every metric name the smoke runs below logged (the keys of their metrics.jsonl files,
#: every stage's) -> the configs that logged it; read by the last test of this module
LOGGED: dict[str, set[str]] = {}
METRICS_PAGE = Path(__file__).parent.parent / "docs" / "reference" / "metrics.md"

#: not configs/gpu/: those need a real model; tests/test_gpu_recipes.py runs them on tiny ones
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
DEFAULT_RUN_CHECKPOINT = re.compile(r"runs/default/\w+/checkpoints/(?:step_\d+|best)/policy")


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
    for metrics in tmp_path.rglob("metrics.jsonl"):
        for line in metrics.read_text().splitlines():
            for name in json.loads(line).keys() - {"step", "time"}:
                LOGGED.setdefault(name, set()).add(path.stem)
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


def documented_metrics() -> list[re.Pattern]:
    """The metric names docs/reference/metrics.md documents, as patterns: every code span
    holding a ``/`` in the first cell of one of its tables. A ``<placeholder>`` in a name
    (``vllm/server<i>_requests``, ``agent/info/<key>``) stands for any text without a ``/``."""
    patterns = []
    for line in METRICS_PAGE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        for name in re.findall(r"`([^`]+/[^`]*)`", line.split(" | ")[0]):
            parts = re.split(r"<[^<>/]+>", name)
            patterns.append(re.compile("[^/]+".join(map(re.escape, parts))))
    return patterns


def test_every_logged_metric_is_documented():
    """Runs after the smoke runs above (this module runs on one worker, in order): each name
    they logged matches an entry of the metrics reference. Zero cost: it reads their files."""
    if not LOGGED:
        pytest.skip("no smoke run of this session logged metrics (run the whole module)")
    patterns = documented_metrics()
    missing = {
        name: sorted(configs)
        for name, configs in sorted(LOGGED.items())
        if not any(p.fullmatch(name) for p in patterns)
    }
    assert not missing, f"metrics logged but not in docs/reference/metrics.md: {missing}"

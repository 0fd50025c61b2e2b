"""Every GPU recipe (``configs/gpu/*.yaml``) runs as written on a tiny random model of its
family: the same config, only its sizes and steps shrunk, ``model.path`` pointed at a local
directory holding a model built with transformers' own classes of the family (a few
thousand parameters) and a tokenizer with the family's chat template, and GSM8K's files
stood in for by the shipped sample. Every stage runs two steps and the last one's policy is
a Hugging Face checkpoint that loads and keeps the chat template. (``tests/test_configs.py``
runs ``configs/*.yaml``, not this folder.)"""

import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from ardea.cli.main import main
from ardea.config import load_config, stage_configs
from ardea.model import build_char_tokenizer
from ardea.model.tokenizer import CHAT_TEMPLATE, IM_END_TOKEN

REPO = Path(__file__).parents[1]
RECIPES = sorted((REPO / "configs" / "gpu").glob("*.yaml"))
SAMPLE = REPO / "examples" / "data" / "gsm8k_mini.jsonl"

#: Qwen2.5's chat template renders a default system turn before a conversation that has
#: none; Qwen3's renders a lone user turn as plain ChatML (its generation prompt opens no
#: think block unless thinking is switched off), which is the character tokenizer's.
QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
QWEN25_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}"
    f"{{{{ '<|im_start|>system\\n{QWEN25_SYSTEM}<|im_end|>\\n' }}}}"
    "{% endif %}" + CHAT_TEMPLATE
)
#: the recipe file's name starts with its family: (config class, model class, chat template)
FAMILIES = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, CHAT_TEMPLATE),
    "qwen2.5": (Qwen2Config, Qwen2ForCausalLM, QWEN25_TEMPLATE),
}
SHRUNK = [
    "trainer.max_steps=2",
    "trainer.batch_size=4",
    "trainer.grad_accum_steps=2",
    "trainer.warmup_steps=1",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "data.train_size=16",
    "data.eval_size=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.report=false",
]


def family_of(recipe: Path) -> str:
    family = recipe.stem.split("_", 1)[0]
    assert family in FAMILIES, f"{recipe.name}: no tiny model of family {family!r} in this test"
    return family


def tiny_family_model(family: str, root: Path) -> Path:
    """A random model of ``family`` (hidden size 32, one layer) and a character tokenizer
    with the family's chat template, ending an answer with ``<|im_end|>`` as Qwen's chat
    models do, saved in ``root``."""
    config_class, model_class, template = FAMILIES[family]
    tokenizer = build_char_tokenizer(model_max_length=2048)
    tokenizer.chat_template = template
    tokenizer.eos_token = IM_END_TOKEN
    ids = tokenizer.convert_tokens_to_ids
    config = config_class(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = model_class(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[ids(IM_END_TOKEN), ids("<eos>")], pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


def gsm8k_stand_in(root: Path) -> None:
    """``data/gsm8k/{train,test}.jsonl`` under ``root``: the shipped sample, split 50 / 10."""
    lines = SAMPLE.read_text(encoding="utf-8").splitlines(keepends=True)
    (root / "data" / "gsm8k").mkdir(parents=True)
    (root / "data" / "gsm8k" / "train.jsonl").write_text("".join(lines[:50]))
    (root / "data" / "gsm8k" / "test.jsonl").write_text("".join(lines[50:]))


def test_the_gpu_recipes_are_shipped_and_say_what_they_cost():
    assert {p.stem for p in RECIPES} >= {"qwen3_0.6b_sft_grpo", "qwen2.5_0.5b_grpo_lora"}
    for recipe in RECIPES:
        header = re.match(r"(#.*\n)+", recipe.read_text()).group(0)
        assert "GPU recipe" in header and "ESTIMATE" in header, recipe.name
        assert re.search(r"about \d+ min", header) and re.search(r"Peak ~\d+ GB", header)
        config = load_config(recipe)
        family = family_of(recipe)
        assert family.replace("qwen", "Qwen") in config.model.path, recipe.name
        for stage in [config] + [c for _, c in stage_configs(config)]:
            assert stage.data.chat_template, f"{recipe.name}: a chat model needs its template"


def test_every_gpu_recipe_is_in_the_ready_configs_table():
    text = (REPO / "docs" / "howto" / "configure.md").read_text(encoding="utf-8")
    table = text.split("## Ready configs", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `gpu/([a-z_0-9.]+\.yaml)` \|", table, re.M))
    assert listed == {p.name for p in RECIPES}


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_gpu_recipe_runs_on_a_tiny_model_of_its_family(recipe, tmp_path, monkeypatch):
    family = family_of(recipe)
    model_dir = tiny_family_model(family, tmp_path / "model")
    gsm8k_stand_in(tmp_path)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    overrides = [*SHRUNK, f"model.path={model_dir}", f"trainer.output_dir={out}"]
    assert main(["train", str(recipe), *overrides]) == 0
    config = load_config(recipe, overrides)
    results = json.loads((out / "results.json").read_text())
    if config.stages:
        assert results["stages"] == list(config.stages)
        assert all(results[name]["steps"] == 2 for name in config.stages)
        last, config = stage_configs(config)[-1]
        out, results = out / last, results[last]
    assert results["steps"] == 2 and results["strategy"] == config.algo.name
    policy = out / "checkpoints" / "step_0000002" / "policy"
    assert (policy.parent / "adapter").is_dir() == (config.model.lora_r > 0)
    model = AutoModelForCausalLM.from_pretrained(policy)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    assert type(model) is FAMILIES[family][1]  # merged: a plain model of the family
    assert tokenizer.chat_template == FAMILIES[family][2]
    question = [{"role": "user", "content": "What is 2 + 3?"}]
    ids = tokenizer.apply_chat_template(question, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()
    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert resolved["model"]["dtype"] == load_config(recipe).model.dtype  # not shrunk

"""A hybrid linear-attention model trained through ``model.path`` as a user's checkpoint
is: a tiny random Qwen3.5 (transformers' class: a gated-delta-net layer, then a
full-attention layer) saved with ``save_pretrained`` beside ardea's character tokenizer,
two steps of online GRPO on the in-process engine. The behaviour log-probs are the
trainer's (float32, the bound of tests/rollout/test_hybrid_models.py), and the saved
``policy/`` loads with plain transformers and greedy-decodes what ardea's engine does."""

from __future__ import annotations

import json

import torch
import transformers

from ardea.config import load_config
from ardea.model import build_char_tokenizer
from ardea.rollout import InProcessEngine, SamplingParams
from ardea.trainer import Trainer


def test_qwen3_5_trains_online_on_the_in_process_engine(tmp_path):
    tokenizer = build_char_tokenizer(model_max_length=256)
    config = transformers.Qwen3_5TextConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_value_heads=2,
        linear_num_key_heads=1, linear_key_head_dim=16, linear_value_head_dim=16,
        layer_types=["linear_attention", "full_attention"], max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Qwen3_5ForCausalLM(config).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    run = tmp_path / "run"
    Trainer(load_config(None, [
        f"model.path={tmp_path / 'model'}", "model.compute_dtype=float32", "algo.name=online_grpo",
        'reward.functions=[{name: format_regex, kwargs: {pattern: "[0-4]"}}]',
        "rollout.max_new_tokens=6", "rollout.group_size=4", "trainer.batch_size=4",
        "trainer.max_steps=2", "trainer.eval_every=0", "trainer.save_every=2",
        "data.eval_size=4", "logging.log_every=1", "logging.progress=false",
        "logging.tensorboard=false", "logging.report=false", f"trainer.output_dir={run}",
    ])).train()  # fmt: skip
    steps = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if "train/loss" in r]  # fmt: skip
    assert len(steps) == 2
    for step in steps:
        assert step["mismatch/abs_diff_max"] <= 1e-5
    assert any(step["train/grad_norm"] > 0 for step in steps)
    saved = transformers.AutoModelForCausalLM.from_pretrained(
        next((run / "checkpoints").glob("step_*")) / "policy"
    ).eval()
    assert type(saved).__name__ == "Qwen3_5ForCausalLM"
    prompt = tokenizer("12+3=", add_special_tokens=False)["input_ids"]
    ours = InProcessEngine(saved, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[])
    (greedy,) = ours.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=8))
    with torch.no_grad():
        plain = saved.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                               eos_token_id=None, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    assert greedy.token_ids == plain[0, len(prompt) :].tolist()

"""One cell of the support matrix: a short run of one strategy on one family's saved model
(``model.path``), and what is checked of it. Shared by the matrix test and the generator of
its documentation page."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers

from ardea.config import load_config
from ardea.rollout import InProcessEngine, SamplingParams
from ardea.trainer import Trainer

REPO = Path(__file__).parents[2]
QUIET = ["trainer.max_steps=2", "trainer.batch_size=4", "trainer.eval_every=0",
         "trainer.save_every=2", "trainer.warmup_steps=1", "data.eval_size=4",
         "data.train_size=16", "logging.log_every=1", "logging.progress=false",
         "logging.tensorboard=false", "logging.report=false", "model.compute_dtype=float32",
         "trainer.num_threads=1"]  # fmt: skip
ONLINE = ['reward.functions=[{name: format_regex, kwargs: {pattern: "[0-4]"}}]',
          "rollout.max_new_tokens=6", "rollout.group_size=2"]  # fmt: skip
#: column -> (what the column means on the page, the run's overrides)
CELLS: dict[str, tuple[str, list[str]]] = {
    "sft": ("SFT", ["algo.name=sft"]),
    "dpo": ("DPO", ["algo.name=dpo"]),
    "grpo": ("online GRPO, in-process engine", ["algo.name=online_grpo", *ONLINE]),
    "ppo": ("online PPO, critic on the same backbone", ["algo.name=online_ppo", *ONLINE]),
    "lora": ("online GRPO with LoRA (q_proj, v_proj)",
             ["algo.name=online_grpo", *ONLINE, "model.lora_r=4",
              "model.lora_target_modules=[q_proj, v_proj]"]),
    "replay": ("online GRPO with routing replay (MoE)",
               ["algo.name=online_grpo", *ONLINE, "algo.moe_routing_replay=true"]),
}  # fmt: skip
#: float32 engine and trainer: the behaviour log-probs' bound (tests/rollout/test_hybrid_models.py)
MISMATCH_BOUND = 1e-5


def run_cell(model: Path, cell: str, out: Path, extra: list[str] = ()) -> list[dict]:
    """Train ``cell``'s two steps on ``model`` (with ``extra`` overrides); the logged
    steps' records."""
    overrides = [f"model.path={model}", f"trainer.output_dir={out}", *QUIET, *CELLS[cell][1],
                 *extra]  # fmt: skip
    Trainer(load_config(None, overrides)).train()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "train/loss" in r]


def check_steps(steps: list[dict], online: bool) -> None:
    """Two steps, finite losses, gradients, and (online) behaviour log-probs within bound."""
    assert len(steps) == 2, steps
    for step in steps:
        assert torch.isfinite(torch.tensor(step["train/loss"]))
        if online:
            assert step["mismatch/abs_diff_max"] <= MISMATCH_BOUND, step["mismatch/abs_diff_max"]
    assert any(step["train/grad_norm"] > 0 for step in steps)


def check_export(run: Path, tokenizer, prompt: str = "12+3=") -> None:
    """The saved ``policy/`` loads with plain transformers and greedy-decodes what ardea's
    engine decodes from it."""
    policy = next((run / "checkpoints").glob("step_*")) / "policy"
    saved = transformers.AutoModelForCausalLM.from_pretrained(policy).eval()
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    engine = InProcessEngine(saved, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[])
    (ours,) = engine.generate([ids], SamplingParams(temperature=0.0, max_new_tokens=8))
    with torch.no_grad():
        plain = saved.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                               eos_token_id=None, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    assert ours.token_ids == plain[0, len(ids) :].tolist()


def check_engine(model_dir: Path, tokenizer) -> None:
    """Continuous batching on the family: 3 prompts of different lengths × 2 samples, at
    most 3 rows decoded together (the others join a running batch), sampled; every
    completion's behaviour log-probs equal one full forward of its row (float32, the bound
    above), computed here with transformers alone."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in
               ("12+3=", "4+56=", "7=")]  # fmt: skip
    engine = InProcessEngine(model, pad_token_id=tokenizer.pad_token_id,
                             eos_token_ids=[tokenizer.eos_token_id], max_batch_size=3)  # fmt: skip
    params = SamplingParams(temperature=1.0, max_new_tokens=12, min_new_tokens=12, n=2, seed=0)
    for c in engine.generate(prompts, params):
        row = torch.tensor([c.prompt_ids + c.token_ids])
        with torch.no_grad():
            logits = model(row).logits[0, len(c.prompt_ids) - 1 : -1].double()
        eos = tokenizer.eos_token_id
        logits[:, eos] = float("-inf")  # min_new_tokens: the stop token masked while sampling
        full = torch.log_softmax(logits, -1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(c.logprobs, dtype=torch.float64), full,
                                   atol=MISMATCH_BOUND, rtol=0)  # fmt: skip

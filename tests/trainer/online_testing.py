"""Shared pieces of the online-RL trainer tests: a tiny online run, its metrics, and a way
to see every rollout the trainer's runner makes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

REWARD_MODULE = '''
def digit_fraction(prompts, completions, rows):
    """Share of completion characters that are digits: a random policy scores ~4%."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
'''

#: a 30-step online GRPO run of a tiny model on the digit-share reward (``reward_module``), in
#: float32 whatever the CPU (the tests compare with values worked out in float64)
RUN = [
    "model.compute_dtype=float32",
    "algo.name=online_grpo",
    "reward.functions=[{name: ardea_test_rewards.digit_fraction}]",
    "trainer.max_steps=30",
    "trainer.batch_size=8",
    "trainer.lr=1e-2",
    "trainer.warmup_steps=1",
    "trainer.lr_schedule=constant",
    "trainer.eval_every=0",
    "rollout.group_size=8",
    "rollout.max_new_tokens=8",
    "data.eval_size=8",
    "logging.log_every=1",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.report=false",  # no report.png: half a second a run
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=128",
]


def metrics(run_dir: Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl``."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def record_rollouts(trainer, change=None) -> list:
    """Wrap the trainer's rollout runner: every scored :class:`~ardea.rollout.Rollout`
    (first rounds and refills, in order) is appended to the returned list, after
    ``change(rollout)`` when given (which may replace its batch)."""
    seen = []
    score = trainer.service.runner.score

    def recording(generation):
        result = score(generation)
        if change is not None:
            result.batch = change(result.batch)
        seen.append(result)
        return result

    trainer.service.runner.score = recording
    return seen


def completion_lengths(batch) -> torch.Tensor:
    """``(N,)`` generated tokens per row of a rollout batch (its loss-mask count)."""
    return batch.loss_mask.sum(dim=-1)


def naive_token_logprobs(model, batch) -> torch.Tensor:
    """``(N, S - 1)`` float64 log-probs at T = 1 from one full forward (no ardea code):
    entry ``t`` is ``log p(input_ids[:, t + 1] | input_ids[:, :t + 1])``."""
    ids, attn = batch.input_ids, batch.attention_mask
    positions = (attn.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=positions).logits
    logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
    return logp.gather(-1, ids[:, 1:, None]).squeeze(-1)


def group_advantages(rewards: list[float], group_size: int) -> list[float]:
    """GRPO by hand: ``(R - mean_g) / (std_g + 1e-8)``, population std, per group."""
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / len(group))
        out += [(r - mean) / (std + 1e-8) for r in group]
    return out

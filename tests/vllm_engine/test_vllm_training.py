"""`ardea train` with rollout.engine=vllm on the session's real vLLM server: online GRPO and
an agent run end to end, the behaviour log-probs equal to the trainer's, every step's
weights synced; a server that cannot be reached fails the run naming it and keeps its
checkpoints, and the run resumes from them. Partial rollouts on servers a run launches
(the live engine's and the background worker's own) run as the README's command does
(tests/cli/test_readme_commands.py); their stop-and-resume on the engine is
test_vllm_requests.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from numerics import decoder_gradient_terms, gamma
from run_metrics import assert_same_step_metrics
from vllm_testing import PYTHON, SIZE, SIZE_OVERRIDES, TOKENIZER, tiny

from ardea.config import load_config
from ardea.rollout.engines.vllm.server import VLLMServerError
from ardea.trainer import Trainer

pytestmark = pytest.mark.slow  # a real vLLM server (its start alone takes ~30 s)

RUN = [
    *SIZE_OVERRIDES,
    "model.compute_dtype=float32",
    "algo.name=online_grpo",
    'reward.functions=[{name: format_regex, kwargs: {pattern: "[0-4]"}}]',
    "rollout.engine=vllm",
    "rollout.vllm.timeout_s=60",
    "rollout.max_new_tokens=6",
    "rollout.group_size=4",
    "trainer.batch_size=4",
    "trainer.max_steps=2",
    "trainer.eval_every=0",
    "trainer.save_every=1",
    "data.eval_size=4",
    "logging.log_every=1",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.report=false",  # no report.png: half a second a run
]


def records(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "train/loss" in r]


def train(run_dir, url, *extra):
    config = load_config(None, [*RUN, f"rollout.vllm.urls=[{url}]", f"trainer.output_dir={run_dir}", *extra])  # fmt: skip
    return Trainer(config).train()


def test_online_grpo_on_vllm(vllm_url, tmp_path):
    results = train(tmp_path, vllm_url)
    assert results["steps"] == 2
    steps = records(tmp_path)
    assert len(steps) == 2
    for step in steps:
        assert step["vllm/sync_logprob_error"] < 1e-4  # every step's weights reached the server
        # the server's behaviour log-probs are the trainer's (fp32 on both sides)
        assert step["mismatch/abs_diff_mean"] <= 1e-4 and step["mismatch/abs_diff_max"] <= 1e-3
        assert step["train/grad_norm"] > 0


def test_online_grpo_on_vllm_under_torchrun(vllm_url, tmp_path):
    """Two trainer ranks (FSDP2) and one owner of the engine, rank 0: each step's weights
    are gathered once, onto it, and reach the server (the sync probe and the behaviour
    log-probs agree with the trainer's, fp32), with ``ardea train`` as a user launches it.
    With a distillation teacher the run launches on vLLM: one server for the job (rank 0's;
    its log holds one start-up), where each rank scores its share of the rows."""
    ardea = Path(sys.executable).parent / "ardea"
    teacher = tmp_path / "teacher_model"
    tiny(seed=5).save_pretrained(teacher)
    TOKENIZER.save_pretrained(teacher)
    overrides = [*RUN, f"rollout.vllm.urls=[{vllm_url}]", f"trainer.output_dir={tmp_path / 'run'}",
                 "trainer.num_threads=1", "trainer.save_every=0", "trainer.distributed=fsdp2",
                 f"algo.teacher={{path: {teacher}, engine: vllm, python: {PYTHON}}}"]  # fmt: skip
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(ardea), "train", "configs/online_grpo.yaml",
               *overrides]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    repo = Path(__file__).parents[2]
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    steps = records(tmp_path / "run")
    assert len(steps) == 2
    for step in steps:
        assert step["vllm/sync_logprob_error"] < 1e-4
        assert step["mismatch/abs_diff_mean"] <= 1e-4 and step["mismatch/abs_diff_max"] <= 1e-3
        assert step["train/grad_norm"] > 0
        # two random tiny models: both near log(1/V) = -5.6 per token, so their k1 gap is
        # small but not 0; a share of rows left unscored (log q = 0) would pull it below -2
        assert 0 < abs(step["teacher/reverse_kl"]) < 0.5
    log = (tmp_path / "run" / "teacher" / "server.log").read_text()
    assert log.count("Application startup complete") == 1, log[-3000:]


def test_lora_on_vllm_under_torchrun_steps_as_one_process(vllm_url, tmp_path):
    """A LoRA policy on the session's server under ``torchrun --nproc-per-node 2`` (FSDP2,
    rank 0 owns the engine and syncs the adapter) against the same run in one process: the
    first step's rollout is the same (the same seeds and weights on the same server, so its
    metrics are equal) and so is everything trained from it (gradient norm, loss, advantages:
    float32 summation order, tests/run_metrics.py), and each step's adapter reached the
    server (its log-probs are the trainer's)."""
    lora = [*RUN, f"rollout.vllm.urls=[{vllm_url}]", "model.lora_r=4", "model.lora_alpha=16",
            "trainer.save_every=0", "trainer.num_threads=1"]  # fmt: skip
    one, two = tmp_path / "one", tmp_path / "two"
    Trainer(load_config(None, [*lora, f"trainer.output_dir={one}"])).train()
    ardea = Path(sys.executable).parent / "ardea"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(ardea), "train", "--recipe", "none", *lora,
               "trainer.distributed=fsdp2", f"trainer.output_dir={two}"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    repo = Path(__file__).parents[2]
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    # rows: 4 prompts x 4 samples of at most 13 tokens: test_torchrun.py's derivation
    model = SimpleNamespace(vocab_size=len(TOKENIZER), hidden_size=SIZE["hidden_size"],
                            intermediate_size=SIZE["intermediate_size"],
                            num_hidden_layers=SIZE["num_layers"])  # fmt: skip
    assert_same_step_metrics(one, two, 1, gamma(decoder_gradient_terms(model, rows=16, span=64)))
    for step in records(two):
        assert step["vllm/sync_logprob_error"] < 1e-4


def test_an_agent_run_on_vllm(vllm_url, tmp_path):
    agent = [o for o in RUN if not o.startswith("reward.")]
    config = load_config(None, [
        *agent, f"rollout.vllm.urls=[{vllm_url}]", f"trainer.output_dir={tmp_path}",
        "data.task=null", "agent.env=guess_number", "agent.max_turns=2", "agent.eval_episodes=1",
    ])  # fmt: skip
    Trainer(config).train()
    steps = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "agent/turns_per_episode" in r]  # fmt: skip
    assert len(steps) == 2 and all(s["agent/generated_tokens"] > 0 for s in steps)


def test_an_unreachable_server_fails_the_run_and_keeps_its_checkpoints(vllm_url, tmp_path):
    train(tmp_path, vllm_url)
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    with pytest.raises(VLLMServerError, match="http://127.0.0.1:9 failed"):
        train(tmp_path, "http://127.0.0.1:9", "trainer.max_steps=3", "trainer.resume=auto")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == saved
    results = train(tmp_path, vllm_url, "trainer.max_steps=3", "trainer.resume=auto")
    assert results["steps"] == 3 and len(records(tmp_path)) == 3


def test_lora_on_vllm_syncs_the_adapter_alone(vllm_url, tmp_path):
    """A LoRA policy on the session's server (started with --enable-lora): the run loads its
    frozen base into it once and each step sends the adapter alone (vllm/sync_bytes: its
    tensors' bytes, here under a tenth of the model's), which the server loads in place; its log-probs equal the
    adapted policy's at every step, and by the end the adapter changes them measurably."""
    config = load_config(None, [
        # seed 3: a base the session's server does not hold until the run reloads it
        *RUN, f"rollout.vllm.urls=[{vllm_url}]", "model.lora_r=4", "model.lora_alpha=16",
        "trainer.seed=3",
        "trainer.lr=0.02", "trainer.max_steps=3", "trainer.save_every=0",
        f"trainer.output_dir={tmp_path}",
    ])  # fmt: skip
    trainer = Trainer(config)
    assert trainer.train()["steps"] == 3
    named = dict(trainer.policy.named_parameters())
    adapter_bytes = sum(p.numel() * p.element_size() for n, p in named.items() if "lora_" in n)
    model_bytes = sum(p.numel() * p.element_size() for n, p in named.items() if "lora_" not in n)
    steps = records(tmp_path)
    assert len(steps) == 3 and adapter_bytes < 0.1 * model_bytes
    for step in steps:
        assert step["vllm/sync_bytes"] == adapter_bytes
        assert step["vllm/sync_logprob_error"] < 1e-4
        assert step["mismatch/abs_diff_mean"] <= 1e-4 and step["mismatch/abs_diff_max"] <= 1e-3
    policy = trainer.policy
    ids = torch.tensor([TOKENIZER("12+34=5")["input_ids"]])
    with torch.no_grad():
        adapted = torch.log_softmax(policy(input_ids=ids).logits.double(), -1)
        with policy.disable_adapter():
            base = torch.log_softmax(policy(input_ids=ids).logits.double(), -1)
    assert (adapted - base).abs().max() > 1e-3  # the synced adapter is not a no-op

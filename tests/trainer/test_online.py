"""Online GRPO and online DPO through the trainer: rollouts from the live policy, rising
reward, staleness, best/worst pairs, exact resume."""

import json
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file

from ardea.config import load_config
from ardea.rollout import StalenessError, check_staleness
from ardea.trainer import Trainer
from ardea.trainer.strategies.online_dpo import best_worst_pairs

REWARD_MODULE = '''
def digit_fraction(prompts, completions, rows):
    """Share of completion characters that are digits: a random policy scores ~4%."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
'''

RUN = [
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
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=128",
]


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "ardea_test_rewards.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("ardea_test_rewards", None)


@pytest.mark.parametrize("strategy", ["online_grpo", "online_dpo"])
def test_reward_rises_from_a_random_policy(strategy, tmp_path, reward_module):
    overrides = [*RUN, f"algo.name={strategy}", f"trainer.output_dir={tmp_path / 'run'}"]
    trainer = Trainer(load_config(None, overrides))
    trainer.train()
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["rollout/reward_mean"] for r in records if "rollout/reward_mean" in r]
    assert len(rewards) == 30
    assert sum(rewards[:3]) / 3 < 0.3  # a random policy rarely writes digits
    assert sum(rewards[-3:]) / 3 > 0.6
    staleness = [r["rollout/staleness"] for r in records if "rollout/staleness" in r]
    assert staleness == [0.0] * 30  # synchronous: every rollout comes from the live policy
    assert trainer.strategy.runner.engine.version == 30  # one published version per step
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} >= set(range(1, 31))  # rollouts of every step
    mid = [s for s in samples if s["step"] == 15]  # 4 rollout samples (evaluations add theirs)
    assert len(mid) == 4 and all(set(s) == {"step", "prompt", "completion", "score"} for s in mid)


def test_staleness_bound():
    versions = torch.tensor([[-1, 3, 3, -1], [-1, 4, 4, 4]])
    assert check_staleness(versions, current=4, max_staleness=1) == 1
    with pytest.raises(StalenessError, match="1 versions behind.*max_staleness=0"):
        check_staleness(versions, current=4, max_staleness=0)
    with pytest.raises(StalenessError, match="future|version 4 but the live policy is 3"):
        check_staleness(versions, current=3, max_staleness=5)


def test_a_stale_rollout_never_reaches_the_loss(tmp_path, reward_module):
    trainer = Trainer(load_config(None, [*RUN, f"trainer.output_dir={tmp_path / 'run'}"]))
    runner = trainer.strategy.runner
    generate = runner.rollout

    def one_version_behind(examples):
        batch = generate(examples)
        batch["versions"] = torch.where(batch["versions"] >= 0, batch["versions"] - 1, -1)
        return batch

    runner.rollout = one_version_behind
    runner.engine.update_weights(None, 1)
    called = []
    trainer.strategy.loss = lambda *args: called.append(args)
    with pytest.raises(StalenessError, match="version 0 is 1 versions behind"):
        trainer.train_step()
    assert not called


def test_online_run_resumes_to_the_same_weights(tmp_path, reward_module):
    short = [*RUN, "trainer.max_steps=6", "trainer.save_every=3"]
    Trainer(load_config(None, [*short, f"trainer.output_dir={tmp_path / 'a'}"])).train()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step_0000006")
    resumed = Trainer(
        load_config(None, [*short, f"trainer.output_dir={tmp_path / 'b'}", "trainer.resume=auto"])
    )
    assert resumed.step == 3 and resumed.strategy.runner.engine.version == 3
    resumed.train()
    final = "checkpoints/step_0000006/policy/model.safetensors"
    a, b = load_file(tmp_path / "a" / final), load_file(tmp_path / "b" / final)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_best_worst_pairs_by_hand():
    batch = {
        "input_ids": torch.arange(12).reshape(6, 2),
        "attention_mask": torch.ones(6, 2, dtype=torch.long),
        "loss_mask": torch.ones(6, 2),
        "rewards": torch.tensor([0.2, 0.9, 0.1, 0.5, 0.5, 0.5]),  # group 1 has no spread
        "group_ids": torch.tensor([0, 0, 0, 1, 1, 1]),
    }
    pairs = best_worst_pairs(batch)
    assert pairs["chosen_input_ids"].tolist() == [[2, 3]]  # row 1: reward 0.9
    assert pairs["rejected_input_ids"].tolist() == [[4, 5]]  # row 2: reward 0.1
    assert pairs["chosen_loss_mask"].shape == (1, 2)


@pytest.mark.parametrize("estimator", ["rloo", "dr_grpo", "reinforce_pp", "reinforce_pp_baseline"])
def test_online_grpo_takes_every_critic_free_estimator(estimator, tmp_path, reward_module):
    overrides = [
        *RUN,
        "trainer.max_steps=2",
        f"algo.ppo.adv_estimator={estimator}",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]
    trainer = Trainer(load_config(None, overrides))
    trainer.train()
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in records if "train/loss" in r]
    assert len(losses) == 2 and all(isinstance(v, float) for v in losses)
    assert trainer.strategy.runner.engine.version == 2

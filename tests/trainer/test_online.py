"""Online GRPO and online DPO through the trainer: rollouts from the live policy, rising
reward, staleness, best/worst pairs, exact resume."""

import json
import math
import re
import shutil
import time
from dataclasses import replace

import pytest
import torch
from online_testing import RUN, record_rollouts
from safetensors.torch import load_file

from ardea.config import load_config
from ardea.data import TrajectoryBatch, preference_pairs
from ardea.errors import ArdeaError
from ardea.reward import RewardError
from ardea.rollout import StalenessError, check_staleness
from ardea.trainer import Trainer
from ardea.trainer.strategies.online_dpo import best_worst_pairs


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
    assert trainer.service.runner.engine.version == 30  # one published version per step
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
    record_rollouts(
        trainer, lambda b: replace(b, versions=torch.where(b.versions >= 0, b.versions - 1, -1))
    )
    trainer.service.publish()  # the live policy is version 1
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
    assert resumed.step == 3 and resumed.service.runner.engine.version == 3
    resumed.train()
    final = "checkpoints/step_0000006/policy/model.safetensors"
    a, b = load_file(tmp_path / "a" / final), load_file(tmp_path / "b" / final)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_best_worst_pairs_by_hand():
    batch = TrajectoryBatch.from_tensors(
        torch.arange(18).reshape(9, 2),
        torch.ones(9, 2, dtype=torch.long),
        torch.ones(9, 2, dtype=torch.bool),
        rewards=torch.tensor([0.2, 0.9, 0.1, 0.5, 0.5, 0.5, 0.0, 0.3, 0.3]),
        group_ids=torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2]),  # group 1 has no spread
    )
    pairs = best_worst_pairs(batch)
    # chosen rows first (group 0: row 1, 0.9; group 2: row 7, the first of the ties at 0.3),
    # then the rejected ones (group 0: row 2, 0.1; group 2: row 6, 0.0)
    assert pairs.input_ids.tolist() == [[2, 3], [14, 15], [4, 5], [12, 13]]
    assert pairs.group_ids.tolist() == [0, 2, 0, 2]
    chosen, rejected = preference_pairs(pairs)
    assert chosen.tolist() == [0, 1] and rejected.tolist() == [2, 3]


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
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    assert trainer.service.runner.engine.version == 2


def test_online_ppo_reward_rises_and_critic_learns(tmp_path, reward_module):
    overrides = [
        *RUN,
        "algo.name=online_ppo",
        "algo.critic_lr=1e-2",
        "algo.ppo.gae_lambda=0.95",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]
    trainer = Trainer(load_config(None, overrides))
    trainer.train()
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["rollout/reward_mean"] for r in records if "rollout/reward_mean" in r]
    assert len(rewards) == 30
    # the reward is the share of digits in a completion: a random policy over the byte
    # tokenizer emits few, a trained one mostly digits
    assert sum(rewards[:3]) / 3 < 0.3
    assert sum(rewards[-3:]) / 3 > 0.6
    trained = [r for r in records if "loss/value" in r]
    for name in ("critic/explained_variance", "critic/grad_norm", "critic/lr", "loss/value"):
        assert all(name in r for r in trained), name
    # the critic starts at V = 0 and learns the rising reward
    assert trained[0]["critic/value_mean"] == 0.0
    assert trained[-1]["critic/value_mean"] > 0.3
    checkpoint = tmp_path / "run" / "checkpoints" / "step_0000030"
    assert (checkpoint / "critic" / "model.safetensors").is_file()


def record_losses(trainer):
    """Wrap the strategy's loss to record (live version, oldest version in the batch)."""
    seen = []
    loss = trainer.strategy.loss

    def recording(batch, counts):
        versions = batch.versions[batch.versions >= 0]
        seen.append((trainer.service.runner.engine.version, int(versions.min())))
        return loss(batch, counts)

    trainer.strategy.loss = recording
    return seen


@pytest.mark.parametrize("strategy", ["online_grpo", "online_ppo"])
def test_bounded_staleness_two(strategy, tmp_path, reward_module):
    """eta = 2: rollouts are generated ahead in a background worker; step s trains on the
    rollout of version max(0, s - 2) and never on an older one."""
    overrides = [
        *RUN,
        f"algo.name={strategy}",
        "rollout.max_staleness=2",
        "trainer.max_steps=8",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]
    trainer = Trainer(load_config(None, overrides))
    seen = record_losses(trainer)
    trainer.train()
    lags = [live - oldest for live, oldest in seen]
    assert [live for live, _ in seen] == list(range(8))
    assert lags == [0, 1, 2, 2, 2, 2, 2, 2]
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/staleness"] for r in records if "rollout/staleness" in r] == lags
    decoupled = [r["loss/behav_imp_weight"] for r in records if "loss/behav_imp_weight" in r]
    assert len(decoupled) == 8  # eta > 0 turns decoupled PPO on by default
    assert trainer.service.worker is None  # closed at the end of training


def test_background_rollouts_are_reproducible(tmp_path, reward_module):
    """The worker's version schedule is fixed, so two eta = 1 runs give the same weights."""
    finals = []
    for name in ("a", "b"):
        overrides = [
            *RUN,
            "rollout.max_staleness=1",
            "trainer.max_steps=5",
            f"trainer.output_dir={tmp_path / name}",
        ]
        Trainer(load_config(None, overrides)).train()
        finals.append(
            load_file(tmp_path / name / "checkpoints/step_0000005/policy/model.safetensors")
        )
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


def test_background_rollouts_are_scored_in_the_worker(tmp_path, reward_module, monkeypatch):
    """With a worker, the reward functions run there (off the trainer's step): every
    scoring call of the run is made on the worker's thread."""
    import threading

    from ardea.rollout import RolloutRunner

    threads = []
    score_texts = RolloutRunner._score_texts

    def spied(self, generation, texts):
        threads.append(threading.current_thread().name)
        return score_texts(self, generation, texts)

    monkeypatch.setattr(RolloutRunner, "_score_texts", spied)
    overrides = [*RUN, "rollout.max_staleness=1", "trainer.max_steps=3",
                 f"trainer.output_dir={tmp_path / 'run'}"]  # fmt: skip
    Trainer(load_config(None, overrides)).train()
    assert threads == ["ardea-rollouts"] * 3
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["perf/reward_s"] > 0 for r in records if "rollout/reward_mean" in r)


def test_epochs_and_mini_batches_reuse_one_rollout(tmp_path, reward_module, monkeypatch):
    """2 epochs x 2 mini-batches: 4 optimizer steps per training step on one rollout whose
    advantages are computed once; one published version per training step."""
    import ardea.trainer.strategies.online_ppo as online_ppo

    calls = []
    compute = online_ppo.compute_advantages
    monkeypatch.setattr(
        online_ppo, "compute_advantages", lambda *a, **k: calls.append(1) or compute(*a, **k)
    )
    overrides = [
        *RUN,
        "algo.name=online_ppo",
        "algo.ppo_epochs=2",
        "algo.ppo_mini_batches=2",
        "trainer.max_steps=3",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]
    trainer = Trainer(load_config(None, overrides))
    steps = []
    critic = trainer.strategy.critic_component
    after = critic.step
    critic.step = lambda: steps.append(1) or after()
    seen = record_losses(trainer)
    trainer.train()
    assert len(calls) == 3  # one advantage computation per rollout
    assert len(steps) == 12  # 3 steps x 2 epochs x 2 mini-batches
    assert trainer.service.runner.engine.version == 3
    assert len(seen) == 12 and all(live - oldest == 0 for live, oldest in seen)
    assert trainer.updater.scheduler.last_epoch == 3  # the schedule advances once per training step


def test_evaluation_does_not_disturb_training(tmp_path, reward_module):
    finals = []
    for name, every in (("quiet", 0), ("evaluated", 2)):
        overrides = [
            *RUN,
            "trainer.max_steps=6",
            f"trainer.eval_every={every}",
            f"trainer.output_dir={tmp_path / name}",
        ]
        Trainer(load_config(None, overrides)).train()
        finals.append(
            load_file(tmp_path / name / "checkpoints/step_0000006/policy/model.safetensors")
        )
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


@pytest.mark.parametrize("max_refill", [1, 3])
def test_dynamic_sampling_keeps_only_groups_with_a_reward_spread(
    tmp_path, write_reward_module, max_refill
):
    """A reward that is 1 for completions starting with an even-valued byte: groups where
    every completion agrees are dropped and refilled; every trained group has a spread and
    its own group_size rows (refilled groups never share an id, however large the round)."""
    write_reward_module(
        "parity_reward",
        "def parity(prompts, completions, rows):\n"
        "    return [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions]\n",
    )
    overrides = [
        *RUN,
        "reward.functions=[{name: parity_reward.parity}]",
        "algo.dynamic_sampling=true",
        f"algo.dynamic_sampling_max_refill={max_refill}",
        "rollout.group_size=2",
        "trainer.max_steps=3",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]
    trainer = Trainer(load_config(None, overrides))
    spreads, sizes, groups_per_step = [], [], []
    loss = trainer.strategy.loss

    def recording(batch, counts):
        groups = batch.group_ids.unique()
        groups_per_step.append(len(groups))
        for group in groups:
            rewards = batch.rewards[batch.group_ids == group]
            sizes.append(rewards.numel())
            spreads.append(float(rewards.max() - rewards.min()))
        return loss(batch, counts)

    trainer.strategy.loss = recording
    # every generation and scoring round of a step (the first and the refills) is counted
    # in its perf/time_generate and perf/time_score
    spent: dict[int, list[float]] = {}
    runner = trainer.service.runner

    def timed(name, index, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            spent.setdefault(trainer.step, [0.0, 0.0])[index] += time.perf_counter() - start
            return result

        setattr(runner, name, wrapper)

    timed("generate", 0, runner.generate)
    timed("score", 1, runner.score)
    trainer.train()
    assert spreads and all(s > 0 for s in spreads)
    assert set(sizes) == {2}
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    kept = [r["rollout/groups_kept"] for r in records if "rollout/groups_kept" in r]
    rounds = [r["rollout/refill_rounds"] for r in records if "rollout/refill_rounds" in r]
    assert len(kept) == 3 and all(0 < k < 1 for k in kept)
    assert all(r >= 1 for r in rounds)
    assert len(groups_per_step) == 3 and all(1 <= g <= 8 for g in groups_per_step)  # <= B
    logged = [r for r in records if "perf/time_generate" in r]
    assert len(logged) == 3
    for record in logged:
        generate, score = spent[record["step"] - 1]
        assert 0 <= record["perf/time_generate"] - generate < 0.05
        assert 0 <= record["perf/time_score"] - score < 0.05


@pytest.mark.parametrize(
    ("missing", "kept", "generated", "cap", "expected"),
    [
        (28, 4, 32, 8, 7),  # 4 of 32 kept: 28 missing groups need 28 / (1/8) = 224 prompts
        (28, 4, 32, 4, 4),  # ... capped at 4 batches
        (10, 12, 96, 8, 3),  # 12 of 96 kept: 10 × 8 = 80 prompts → 2.5 → 3 batches
        (1, 31, 32, 8, 1),  # nearly full: one batch, never zero
        (16, 0, 32, 5, 5),  # nothing kept yet: the cap
    ],
)
def test_refill_round_size_follows_the_kept_share(missing, kept, generated, cap, expected):
    from ardea.rollout.dynamic_sampling import refill_batches

    assert refill_batches(missing, kept=kept, generated=generated, batch_size=32, cap=cap) == (
        expected
    )


@pytest.mark.parametrize(
    "lora", [[], ["model.lora_r=4", "model.lora_alpha=8"]], ids=["full", "lora"]
)
def test_online_ppo_resumes_with_its_critic(lora, tmp_path, reward_module):
    short = [*RUN, "algo.name=online_ppo", "trainer.max_steps=6", "trainer.save_every=3", *lora]
    Trainer(load_config(None, [*short, f"trainer.output_dir={tmp_path / 'a'}"])).train()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step_0000006")
    resumed = Trainer(
        load_config(None, [*short, f"trainer.output_dir={tmp_path / 'b'}", "trainer.resume=auto"])
    )
    assert resumed.step == 3
    resumed.train()
    parts = ["policy/model.safetensors", "critic/model.safetensors"]
    if lora:  # and what the resume itself loads: the adapters and the critic's head
        parts += ["adapter/adapter_model.safetensors", "critic/trainable.safetensors"]
    for part in parts:
        final = f"checkpoints/step_0000006/{part}"
        a, b = load_file(tmp_path / "a" / final), load_file(tmp_path / "b" / final)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), part


def test_online_ppo_with_lora_trains_the_critic_adapters_and_head_only(tmp_path, reward_module):
    """The critic's trained tensors are its adapters and value head; its frozen base stays
    the initial policy's; the saved critic (merged) gives the LoRA critic's values."""
    overrides = [*RUN, "algo.name=online_ppo", "trainer.max_steps=3", "model.lora_r=4",
                 "model.lora_alpha=8", f"trainer.output_dir={tmp_path / 'run'}"]  # fmt: skip
    trainer = Trainer(load_config(None, overrides))
    critic = trainer.strategy.critic
    trained = {n for n, p in critic.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n or n.startswith("value_head.") for n in trained)
    assert {"value_head.weight", "value_head.bias"} <= trained
    before = {n: p.detach().clone() for n, p in critic.named_parameters()}
    trainer.train()
    after = dict(critic.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n].detach())}
    assert changed and changed <= trained  # only adapters and head moved (B starts at 0)
    assert {"value_head.weight"} <= changed and any("lora_B" in n for n in changed)
    from ardea.model import ValueModel

    saved = ValueModel.from_pretrained(tmp_path / "run" / "checkpoints" / "step_0000003" / "critic")
    ids = torch.tensor([[5, 17, 23, 9, 31, 8]])
    with torch.no_grad():
        critic.eval()
        torch.testing.assert_close(saved(ids), critic(ids), atol=1e-5, rtol=1e-4)


def test_online_ppo_refuses_to_resume_without_a_critic(tmp_path, reward_module):
    grpo = [*RUN, "trainer.max_steps=2", f"trainer.output_dir={tmp_path / 'grpo'}"]
    Trainer(load_config(None, grpo)).train()
    checkpoint = tmp_path / "grpo" / "checkpoints" / "step_0000002"
    overrides = [
        *RUN,
        "algo.name=online_ppo",
        f"trainer.resume={checkpoint}",
        f"trainer.output_dir={tmp_path / 'ppo'}",
    ]
    with pytest.raises(ArdeaError, match=r"has no critic/.*cannot resume"):
        Trainer(load_config(None, overrides))


FLAKY_REWARD = '''
CALLS = {"n": 0}

def flaky(prompts, completions, rows):
    """Digit share, but the third call raises (a reward server that went down)."""
    CALLS["n"] += 1
    if CALLS["n"] == 3:
        raise ConnectionError("reward server down")
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
'''


DOWN_REWARD = FLAKY_REWARD.replace("== 3", ">= 3").replace("the third call", "from the third")


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_failing_reward_stops_the_run_and_keeps_what_was_saved(
    staleness, tmp_path, write_reward_module
):
    """A reward server that goes down for good stops the run under on_error=fail. With a
    background worker the failed score is tried again when the trainer takes the rollout,
    so the checkpoints written meanwhile still hold its completions."""
    write_reward_module("flaky_reward", DOWN_REWARD)
    overrides = [
        *RUN,
        "reward.functions=[{name: flaky_reward.flaky}]",
        "reward.on_error=fail",
        f"rollout.max_staleness={staleness}",
        "trainer.max_steps=6",
        "trainer.save_every=1",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]
    trainer = Trainer(load_config(None, overrides))
    with pytest.raises(RewardError, match=r"flaky.*reward server down.*prompt") as failure:
        trainer.train()
    # the failing sample is shown: an arithmetic prompt of the run's task
    assert re.search(r"prompt='?\d+\+\d+=", str(failure.value)), str(failure.value)
    saved = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
    assert saved and all(not name.startswith(".tmp") for name in saved)
    assert trainer.service.worker is None  # the background worker was stopped, no hang


def test_on_error_zero_scores_the_failure_zero_and_counts_it(tmp_path, write_reward_module):
    write_reward_module("flaky_reward", FLAKY_REWARD)
    overrides = [
        *RUN,
        "reward.functions=[{name: flaky_reward.flaky}]",
        "reward.on_error=zero",
        "trainer.max_steps=4",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]
    Trainer(load_config(None, overrides)).train()
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    errors = [r["reward/errors"] for r in records if "reward/errors" in r]
    rewards = [r["rollout/reward_mean"] for r in records if "rollout/reward_mean" in r]
    assert errors == [0.0, 0.0, 64.0, 0.0]  # the third rollout: all 8 x 8 completions
    assert rewards[2] == 0.0


HALF_SCORED = '''
def half(prompts, completions, rows):
    """Digit share; None (cannot score) for every other completion of a group."""
    return [None if i % 2 else sum(ch.isdigit() for ch in c) / max(len(c), 1)
            for i, c in enumerate(completions)]
'''


def test_failed_scores_are_left_out_of_training_by_default(tmp_path, write_reward_module):
    """reward.on_error=mask (the default): half of each group cannot be scored; the run
    trains on the other half (which rows: tests/rollout/test_runner.py), logs the failures
    and a finite loss."""
    write_reward_module("half_reward", HALF_SCORED)
    run = tmp_path / "run"
    overrides = [*RUN, "reward.functions=[{name: half_reward.half}]", "trainer.max_steps=2",
                 f"trainer.output_dir={run}"]  # fmt: skip
    trainer = Trainer(load_config(None, overrides))
    trainer.train()
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward/failed_fraction" in r]
    assert [r["reward/failed_fraction"] for r in steps] == [0.5, 0.5]
    assert [r["reward/half/failed_fraction"] for r in steps] == [0.5, 0.5]
    assert [r["reward/skipped"] for r in steps] == [32.0, 32.0]  # 8 x 8 completions, half
    assert all(math.isfinite(r["train/loss"]) for r in steps)

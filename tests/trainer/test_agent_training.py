"""Agent runs through the trainer: episodes through the RL step (versions, staleness,
background rollouts and their checkpoints), turn-level PPO and GRPO over episodes, the
agent config section's checks."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from online_testing import metrics
from tiny_models import SMALL_OVERRIDES

from ardea.config import load_config
from ardea.errors import ConfigError
from ardea.trainer import Trainer

AGENT = [
    "data.task=null",
    "data.train_size=64",
    "data.eval_size=4",
    "agent.env=guess_number",
    "agent.env_args={high: 8}",
    "agent.max_turns=3",
    "model.compute_dtype=float32",
    *SMALL_OVERRIDES,
    "rollout.group_size=4",
    "rollout.max_new_tokens=3",
    "trainer.batch_size=4",
    "trainer.max_steps=3",
    "trainer.warmup_steps=1",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "logging.log_every=1",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.report=false",  # no report.png: half a second a run
]
PPO_TURN = [
    "algo.name=online_ppo",
    "algo.ppo.gae_timestep_unit=turn",
    "algo.ppo.gae_lambda=ardea.algo.lambda_fn.vapo_length_adaptive_gae",
    "algo.ppo.gae_lambda_kwargs={alpha: 1.0}",
]


def train(tmp_path, *overrides):
    config = load_config(None, [*AGENT, *overrides, f"trainer.output_dir={tmp_path}"])
    trainer = Trainer(config)
    return trainer, trainer.train()


@pytest.mark.parametrize("algo", [PPO_TURN, ["algo.name=online_grpo"]], ids=["ppo", "grpo"])
def test_episodes_train_through_the_rl_step(tmp_path, algo):
    trainer, results = train(tmp_path, *algo)
    assert results["steps"] == 3 and 0.0 <= results["success"] <= 1.0
    records = [r for r in metrics(tmp_path) if "agent/turns_per_episode" in r]
    assert len(records) == 3
    for r in records:
        assert 1.0 <= r["agent/turns_per_episode"] <= 3.0
        assert r["agent/generated_tokens"] > 0 and r["agent/context_tokens"] > 0
        assert r["rollout/staleness"] == 0.0
    assert trainer.service.engine.version == 3


def test_background_episodes_are_checkpointed_and_resumed_exactly(tmp_path):
    """η = 1: the step-2 checkpoint holds the episodes already played for step 3; a run
    resumed from it (the final checkpoint removed, as if the run had died) trains on them
    and ends with the weights of the uninterrupted run."""
    stale = [*PPO_TURN, "rollout.max_staleness=1", "trainer.save_every=2"]
    once, _ = train(tmp_path, *stale)
    final = {k: v.clone() for k, v in once.policy.state_dict().items()}
    state = torch.load(
        tmp_path / "checkpoints" / "step_0000002" / "trainer_state.pt", weights_only=True
    )
    (pending,) = state["rollouts"]["worker"]["pending"].values()
    assert pending["calls"] and len(pending["episodes"]) == 4 * 4
    shutil.rmtree(tmp_path / "checkpoints" / "step_0000003")
    resumed, _ = train(tmp_path, *stale, "trainer.resume=auto")
    assert resumed.step == 3
    for name, value in resumed.policy.state_dict().items():
        torch.testing.assert_close(value, final[name], rtol=0, atol=0, msg=name)
    staleness = [r["rollout/staleness"] for r in metrics(tmp_path) if "rollout/staleness" in r]
    assert staleness == [0.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("agent.env=guess", "unknown environment agent.env='guess'"),
        ("agent.env_args={size: 3}", r"unknown option\(s\) \['size'\]"),
        ("agent.export=turns", "agent.export='turns'"),
        ("agent.history=ignore", "agent.history='ignore'"),
        ("agent.max_turns=0", "agent.max_turns"),
        ("agent.eval_episodes=0", "agent.eval_episodes"),
        ("reward.functions=[{name: length}]", "unknown reward function 'length'"),
        ("reward.overlong_buffer=2", "reward.overlong_buffer is not used"),
    ],
)
def test_agent_options_are_checked(tmp_path, override, message):
    from ardea.trainer.checks import check_config

    with pytest.raises(ConfigError, match=message):
        config = load_config(None, [*AGENT, *PPO_TURN, override, f"trainer.output_dir={tmp_path}"])
        check_config(config)


def test_sft_on_demonstrations_trains_only_assistant_turns(tmp_path):
    trainer, results = train(tmp_path, "algo.name=sft", "trainer.max_steps=2")
    sample = trainer.train_samples[0]
    text = trainer.tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if m])
    assert text and all(ch.isdigit() or ch == "<" or ch in "|im_end>" for ch in text)
    assert json.loads((tmp_path / "results.json").read_text())["success_initial"] >= 0.0


def test_sampled_evaluation_repeats_its_seed(tmp_path):
    """agent.eval_episodes > 1: sampled episodes, the same at every evaluation."""
    config = load_config(
        None, [*AGENT, *PPO_TURN, "agent.eval_episodes=3", f"trainer.output_dir={tmp_path}"]
    )
    trainer = Trainer(config)
    first, _ = trainer.evaluator.agent.run()
    again, _ = trainer.evaluator.agent.run()
    assert first == again
    assert trainer.evaluator.agent.runner.group_size == 3
    assert trainer.evaluator.agent.runner.params.temperature == config.rollout.temperature


def test_an_environment_run_adds_its_reward_functions_terms(tmp_path):
    """reward.functions of an agent.env run score every episode on top of the environment's
    reward: the same episodes (same seeds) with and without format_regex (1 when the last
    reply holds a digit, weight 0.25) differ by exactly that term."""
    regex = "reward.functions=[{name: format_regex, weight: 0.25, kwargs: {pattern: '[0-9]'}}]"

    def played(*extra):
        config = load_config(None, [*AGENT, "algo.name=online_grpo", "trainer.max_steps=1",
                                    *extra, f"trainer.output_dir={tmp_path / str(len(extra))}"])  # fmt: skip
        trainer = Trainer(config)
        runner = trainer.service.runner
        episodes = runner.generate(trainer.train_samples[:2], seed_index=0)
        return episodes, runner.score(episodes)

    (plain, _), (scored, rollout) = played(), played(regex)
    terms = []
    for before, after in zip(plain.episodes, scored.episodes):
        assert after.messages == before.messages  # the same episode
        last = [m for m in after.messages if m["role"] == "assistant"][-1]["content"]
        terms.append(0.25 * any(ch.isdigit() for ch in last))
        assert after.reward == pytest.approx(before.reward + terms[-1])
    assert rollout.metrics["reward/format_regex/failed_fraction"] == 0.0
    assert sum(rollout.batch.rewards.tolist()) == pytest.approx(
        sum(e.reward for e in scored.episodes)
    )
    assert any(terms)  # some last reply holds a digit: the term is not vacuous

"""``ardea train`` drives any engine through the documented interface only: an engine with
no ``.model`` (tests/agent/agent_testing.py's InterfaceEngine, built from the spec alone)
runs online GRPO and an agent run; the trainer pushes every trained step to it as a new
version and closes it at the end."""

from online_testing import RUN, metrics

from ardea.config import load_config
from ardea.trainer import Trainer
from tests.agent.agent_testing import InterfaceEngine

ENGINE = "rollout.engine=tests.agent.agent_testing.interface_engine"
BASE = [o for o in RUN if not o.startswith("reward.")]  # each test names its own reward
SEVENS = 'reward.functions=[{name: format_regex, kwargs: {pattern: "7"}}]'


def run(tmp_path, *overrides):
    InterfaceEngine.INSTANCES.clear()
    run_dir = f"trainer.output_dir={tmp_path}"
    config = load_config(None, [*BASE, ENGINE, "trainer.max_steps=2", run_dir, *overrides])
    trainer = Trainer(config)
    results = trainer.train()
    (engine,) = InterfaceEngine.INSTANCES
    return trainer, engine, results


def test_online_grpo_on_an_engine_without_a_model(tmp_path):
    trainer, engine, _ = run(tmp_path, SEVENS)
    assert not hasattr(engine, "model")
    tensors = len(trainer.policy.state_dict())
    assert engine.updates == [(1, tensors), (2, tensors)]  # each step, the whole policy
    assert engine.closed
    # the first evaluation's 8 greedy rows, then step 1's 8 prompts x 8 samples (rows
    # 0..63), half of which answer "7" (reward 1)
    assert engine.rows_seen[:72] == list(range(8)) + list(range(64))
    steps = [m for m in metrics(tmp_path) if "rollout/reward_mean" in m]
    assert [m["rollout/reward_mean"] for m in steps] == [0.5, 0.5]
    assert all(m["train/grad_norm"] > 0 for m in steps)


def test_an_agent_run_on_an_engine_without_a_model(tmp_path):
    trainer, engine, _ = run(
        tmp_path, "data.task=null", "agent.env=guess_number", "agent.max_turns=2",
        "agent.eval_episodes=1", "trainer.batch_size=4", "rollout.group_size=4",
    )  # fmt: skip
    assert engine.updates and engine.updates[-1][0] == 2 and engine.closed
    steps = [m for m in metrics(tmp_path) if "agent/turns_per_episode" in m]
    assert len(steps) == 2
    # every reply is "7" or "x": one token and the stop token
    assert all(m["agent/generated_tokens"] == 2 * m["agent/turns_per_episode"] for m in steps)

"""Online RL on a file of prompt records: the records' columns reach the reward functions,
evaluation without a task, held-out prompts scored by the reward functions."""

import json

import pytest
from online_testing import RUN

from ardea.config import load_config
from ardea.errors import ConfigError
from ardea.trainer import Trainer

REWARDS = '''
def allowed_fraction(prompts, completions, rows):
    """Share of completion characters found in the row's 'allowed' column."""
    return [
        sum(ch in row["allowed"] for ch in c) / max(len(c), 1)
        for c, row in zip(completions, rows)
    ]


def weight(prompts, completions, rows):
    """The row's 'weight' column, whatever the completion."""
    return [float(row["weight"]) for row in rows]
'''


def write_prompts(path, n, **columns):
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i), **columns} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_online_grpo_learns_from_a_prompt_file_without_a_task(tmp_path, write_reward_module):
    write_reward_module("ardea_prompt_rewards", REWARDS)
    data = write_prompts(tmp_path / "prompts.jsonl", 40, allowed="0123456789")
    overrides = [
        *RUN,
        "data.task=null",
        f"data.path={data}",
        "reward.functions=[{name: ardea_prompt_rewards.allowed_fraction}]",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]
    trainer = Trainer(load_config(None, overrides))
    results = trainer.train()
    logged = records(tmp_path / "run" / "metrics.jsonl")
    rewards = [r["rollout/reward_mean"] for r in logged if "rollout/reward_mean" in r]
    assert len(rewards) == 30
    assert sum(rewards[:3]) / 3 < 0.3 and sum(rewards[-3:]) / 3 > 0.6
    assert not any(k.startswith("eval/") or k == "rollout/accuracy" for r in logged for k in r)
    assert not any("accuracy" in k or "eval_" in k for k in results)
    prompts = {r["prompt"] for r in records(tmp_path / "run" / "samples.jsonl")}
    assert prompts <= {f"{i}+{i}=" for i in range(40)} and prompts


def test_held_out_prompts_are_scored_by_the_reward_functions(tmp_path, write_reward_module):
    write_reward_module("ardea_prompt_rewards", REWARDS)
    train = write_prompts(tmp_path / "train.jsonl", 16, weight=1.0)
    held_out = tmp_path / "held_out.jsonl"
    rows = [{"prompt": f"{i}+1=", "weight": w} for i, w in enumerate([0.25, 0.5, 1.0, 2.0])]
    held_out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = [
        *RUN,
        "trainer.max_steps=2",
        "data.task=arithmetic",  # evaluates accuracy on its held-out split; trains on the file
        f"data.path={train}",
        f"data.eval_path={held_out}",
        "reward.functions=[{name: ardea_prompt_rewards.weight, weight: 2.0}]",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]
    results = Trainer(load_config(None, overrides)).train()
    logged = records(tmp_path / "run" / "metrics.jsonl")
    expected = 2.0 * (0.25 + 0.5 + 1.0 + 2.0) / 4  # the function's weight times the mean
    assert [r["eval/reward_mean"] for r in logged if "eval/reward_mean" in r] == [expected] * 2
    assert [r["step"] for r in logged if "eval/accuracy" in r] == [0, 2]
    assert not any("rollout/accuracy" in r for r in logged)  # the prompts are not the task's
    assert results["eval_reward_initial"] == results["eval_reward"] == expected
    assert [r["rollout/reward_mean"] for r in logged if "rollout/reward_mean" in r] == [2.0] * 2


def test_a_prompt_file_needs_room_for_the_completion(tmp_path):
    data = write_prompts(tmp_path / "prompts.jsonl", 4)
    overrides = [*RUN, "data.task=null", f"data.path={data}", "data.max_length=8"]
    with pytest.raises(ConfigError, match="rollout.max_new_tokens=8 leaves no room for a prompt"):
        Trainer(load_config(None, [*overrides, f"trainer.output_dir={tmp_path / 'run'}"]))

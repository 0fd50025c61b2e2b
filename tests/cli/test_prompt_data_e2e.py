"""``ardea train`` on a prompt JSONL with a reward function by dotted path (online GRPO, no
task), completions forced to full length by ``rollout.min_new_tokens``."""

import json
from pathlib import Path

import pytest
from cli_testing import ardea

pytestmark = pytest.mark.slow
PROMPTS = Path(__file__).parents[2] / "examples" / "data" / "prompts.jsonl"

REWARDS = '''
def answer_characters(prompts, completions, rows):
    """Share of completion characters that occur in the row's answer column."""
    return [
        sum(ch in row["answer"] for ch in c) / max(len(c), 1)
        for c, row in zip(completions, rows)
    ]
'''

CONFIG = f"""
algo: {{name: online_grpo}}
data: {{task: null, path: {PROMPTS}}}
reward: {{functions: [{{name: my_rewards.answer_characters}}]}}
rollout: {{group_size: 8, max_new_tokens: 8, min_new_tokens: 8}}
model: {{hidden_size: 64, num_layers: 2, num_heads: 2, num_kv_heads: 1, intermediate_size: 128}}
trainer:
  max_steps: 25
  batch_size: 8
  lr: 1.0e-2
  warmup_steps: 0
  lr_schedule: constant
  num_threads: 1
  output_dir: run
logging: {{log_every: 1, progress: false, tensorboard: false}}
"""


def test_online_grpo_from_a_prompt_file_with_forced_lengths(tmp_path):
    (tmp_path / "my_rewards.py").write_text(REWARDS)  # importable: the CLI runs in tmp_path
    (tmp_path / "grpo.yaml").write_text(CONFIG)
    ardea("train", "grpo.yaml", cwd=tmp_path)
    run = tmp_path / "run"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == list(range(1, 26))  # no evaluation without a task
    assert {r["rollout/response_length"] for r in steps} == {8.0}  # no early stop
    assert {r["rollout/truncated_fraction"] for r in steps} == {1.0}
    rewards = [r["rollout/reward_mean"] for r in steps]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2  # it learned from the column
    results = json.loads((run / "results.json").read_text())
    assert results["data"] == str(PROMPTS) and results["task"] is None
    assert (tmp_path / results["checkpoint"] / "model.safetensors").is_file()

"""The features the rollout service makes possible under torchrun, each a 3-step run:
``python features.py ROOT [NAME ...]`` in one process, or under ``torchrun`` in two
(``<ROOT>/<world>/<name>``). Each run records its optimizer steps (cases.py) and writes
``metrics.jsonl`` and ``results.json`` like any run.

- ``dynamic``: online GRPO with DAPO's dynamic sampling (a reward that leaves some groups
  without a spread, so the step refills);
- ``background``: online GRPO with background rollouts (``rollout.max_staleness=1``);
- ``online_dpo``: online DPO (a step's pairs are the groups with a reward spread: their
  number does not split evenly over the ranks);
- ``lora``, ``lora_ddp``: online GRPO training LoRA adapters, under FSDP2 and under DDP
  (the engine generates with the adapters on its own whole copy; the checkpoint merges
  them on rank 0);
- ``agent``: turn-level PPO on episodes of an agent environment (``agent.env``);
- ``workflow``, ``workflow_in_process``: online GRPO on an agent workflow written with the
  ``openai`` package, served to it over HTTP and in process (``agent.transport``);

the agent runs' environment and workflow are feature_agents.py's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO)]  # cases.py; the agent's environment by dotted path

from cases import DIGIT_REWARD, train  # noqa: E402

ONLINE = [
    "data.task=arithmetic",
    "data.eval_size=1",
    "data.train_size=64",
    "rollout.group_size=4",
    "rollout.max_new_tokens=6",
    "trainer.batch_size=4",
]
#: a completion with a digit from 0 to 2 scores 1: rarer than any digit, so some groups of 4
#: have none and dynamic sampling refills (the test checks that it did)
RARE_DIGIT = "reward.functions=[{name: format_regex, kwargs: {pattern: '[0-2]'}}]"
WORKFLOW_ROWS = "workflow_rows.jsonl"

FEATURES = {
    "dynamic": [
        *ONLINE,
        RARE_DIGIT,
        "algo.name=online_grpo",
        "algo.dynamic_sampling=true",
        "algo.dynamic_sampling_max_rounds=2",
    ],
    "background": [*ONLINE, DIGIT_REWARD, "algo.name=online_grpo", "rollout.max_staleness=1"],
    "online_dpo": [*ONLINE, DIGIT_REWARD, "algo.name=online_dpo"],
    "lora": [
        *ONLINE,
        DIGIT_REWARD,
        "algo.name=online_grpo",
        "model.lora_r=4",
        "model.lora_alpha=8",
    ],
    "lora_ddp": [
        *ONLINE,
        DIGIT_REWARD,
        "algo.name=online_grpo",
        "model.lora_r=4",
        "model.lora_alpha=8",
        "trainer.distributed=ddp",  # two processes only: one process runs without
    ],
    "agent": [
        "data.task=null",
        "data.train_size=16",
        "data.eval_size=2",
        "reward.functions=[{name: task}]",  # the default: the environment rewards
        "agent.env=tests.distributed.feature_agents.LettersEnv",
        "agent.max_turns=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=3",
        "algo.name=online_ppo",
        "algo.ppo.gae_timestep_unit=turn",
    ],
    "workflow": [
        "data.task=null",
        "reward.functions=[{name: task}]",  # the default: the workflow rewards
        "agent.workflow=tests/distributed/feature_agents.py:run",
        "agent.transport=http",
        "rollout.group_size=2",
        "rollout.max_new_tokens=3",
        "algo.name=online_grpo",
    ],
    "workflow_in_process": [
        "data.task=null",
        "reward.functions=[{name: task}]",
        "agent.workflow=tests/distributed/feature_agents.py:run",
        "agent.transport=in_process",
        "rollout.group_size=2",
        "rollout.max_new_tokens=3",
        "algo.name=online_grpo",
    ],
}
STEPS = 3


def feature_overrides(name: str, root: Path) -> list[str]:
    """``FEATURES[name]``, with the workflow's rows file (written under ``root`` by every
    rank: the same bytes, renamed into place)."""
    extra = list(FEATURES[name])
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        extra = [o for o in extra if not o.startswith("trainer.distributed=")]
    if name.startswith("workflow"):
        rows = root / WORKFLOW_ROWS
        lines = [json.dumps({"row": i}) for i in range(16)]
        partial = rows.with_suffix(f".{os.getpid()}")
        partial.write_text("\n".join(lines) + "\n")
        os.replace(partial, rows)
        extra.append(f"data.path={rows}")
    return extra


def main(root: Path, names: list[str]) -> None:
    """Run ``names`` (default: every feature) for 3 steps at this launch's world size: FSDP2
    under torchrun, one process otherwise; cases.py's model, batch and float32 settings."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    mode = "fsdp2" if world > 1 else "none"
    os.chdir(REPO)  # the workflow's file path is relative to where the run starts
    for name in names or list(FEATURES):
        extra = tuple(feature_overrides(name, root))
        train("online_grpo", root / str(world) / name, mode, steps=STEPS, extra=extra)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])

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

and combinations of features that nothing else runs under torchrun:

- ``agent_background``: the agent environment with background rollouts (η = 1);
- ``partial``: background rollouts resumed across a weight update (``rollout.partial``);
- ``distill``: on-policy distillation from a teacher model (``algo.teacher``);
- ``reward_model``: a reward model's score as the reward (``reward_model`` function).

The agent runs' environment and workflow are feature_agents.py's; their episodes differ in
length and in how many rows they give, so rows arrive out of group order. Every run writes
the group ids of each update's micro-batches before they are shared out over the ranks
(``<run>/micro_batch_groups.json``, rank 0), so the test can tell that they did, and each
step's rows token by token (``<run>/rollout_rows.json``), so the test can compare the
rollout that two ranks generated, each its share, with one process's. The teacher
and the reward model are tiny random models written under ``ROOT`` (:func:`frozen_models`).
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO)]  # cases.py; the agent's environment by dotted path

from cases import COMMON, DIGIT_REWARD, train  # noqa: E402

ONLINE = [
    "data.task=arithmetic",
    "data.eval_size=3",  # split 2 + 1 over two ranks
    "trainer.eval_samples=2",  # avg@2, pass@2: sampled evaluation split too
    "data.train_size=64",
    "rollout.group_size=4",
    "rollout.max_new_tokens=6",
    "trainer.batch_size=4",
]
#: a completion with a digit from 0 to 2 scores 1: rarer than any digit, so some groups of 4
#: have none and dynamic sampling refills (the test checks that it did)
RARE_DIGIT = "reward.functions=[{name: format_regex, kwargs: {pattern: '[0-2]'}}]"
WORKFLOW_ROWS = "workflow_rows.jsonl"
WHOLE_GATHERS = "whole_gathers.txt"  # the loop's whole-model gathers (count_whole_gathers)
ROLLOUT_ROWS = "rollout_rows.json"  # each step's trained rows (record_micro_batch_groups)
TEACHER, REWARD_MODEL = "teacher", "reward_model"
AGENT = [
    "data.task=null",
    "data.train_size=16",
    "data.eval_size=2",
    "reward.functions=[{name: task}]",  # the default: the environment rewards
    "agent.env=tests.distributed.feature_agents.LettersEnv",
    "agent.max_turns=3",
    "rollout.group_size=2",
    "rollout.max_new_tokens=3",
    "algo.name=online_ppo",
    "algo.ppo.gae_timestep_unit=turn",
]

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
    "agent": AGENT,
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
    "agent_background": [*AGENT, "rollout.max_staleness=1"],
    "partial": [
        *ONLINE,
        DIGIT_REWARD,
        "algo.name=online_grpo",
        "rollout.max_staleness=1",
        "rollout.partial=true",
    ],
    "distill": [
        *ONLINE,
        "reward.functions=[{name: task, weight: 0.0}]",  # the teacher's reward alone
        "algo.name=online_grpo",
        "algo.teacher.kl=reverse_k1",
        "algo.teacher.coef=1.0",
    ],
    "reward_model": [*ONLINE, "algo.name=online_grpo"],
}
STEPS = 3


def frozen_models(root: Path) -> dict[str, Path]:
    """A teacher (a causal LM) and a reward model (one score per text) of the runs' size and
    tokenizer, random, under ``root``: written by every rank, the first one renamed into
    place is used."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from ardea.config import load_config
    from ardea.model import build_char_tokenizer, tiny_config

    tokenizer = build_char_tokenizer()
    m = load_config(None, COMMON).model
    paths = {}
    for name, head in ((TEACHER, AutoModelForCausalLM), (REWARD_MODEL, AutoModelForSequenceClassification)):  # fmt: skip
        path = paths[name] = root / name
        if path.is_dir():
            continue
        config = tiny_config(tokenizer, hidden_size=m.hidden_size, num_layers=m.num_layers,
                             num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                             intermediate_size=m.intermediate_size, arch=m.arch)  # fmt: skip
        config.num_labels = 1
        torch.manual_seed(11)
        model = head.from_config(config)
        partial = root / f"{name}.{os.getpid()}"
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        try:
            os.rename(partial, path)
        except OSError:  # the other rank's is in place: the same weights
            pass
    return paths


def feature_overrides(name: str, root: Path) -> list[str]:
    """``FEATURES[name]``, with the workflow's rows file (written under ``root`` by every
    rank: the same bytes, renamed into place) and the frozen models' paths."""
    extra = list(FEATURES[name])
    if name == "distill":
        extra.append(f"algo.teacher.path={frozen_models(root)[TEACHER]}")
    if name == "reward_model":
        rm = frozen_models(root)[REWARD_MODEL]
        extra.append(f"reward.functions=[{{name: reward_model, kwargs: {{path: {rm}}}}}]")
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


@contextmanager
def record_micro_batch_groups(path: Path):
    """While open, every step's updates are written to ``path`` (JSON, rank 0) as they are
    before the ranks share them out: per step, per update, per micro-batch, its rows' group
    ids in row order; and beside it (:data:`ROLLOUT_ROWS`) each step's trained rows, as
    sorted ``(group id, token ids)`` pairs."""
    from ardea.trainer.step import rl_step

    shard = rl_step.shard_updates
    steps: list = []

    rows: list = []

    def recording(updates, rank, world_size):
        steps.append([[b.group_ids.tolist() for b in micro] for micro in updates])
        rows.append(sorted({
            (int(g), tuple(ids[mask].tolist()))
            for micro in updates for b in micro
            for g, ids, mask in zip(b.group_ids, b.input_ids, b.attention_mask.bool())
        }))  # fmt: skip
        if rank == 0:
            path.write_text(json.dumps(steps))
            path.with_name(ROLLOUT_ROWS).write_text(json.dumps(rows))
        return shard(updates, rank, world_size)

    rl_step.shard_updates = recording
    try:
        yield
    finally:
        rl_step.shard_updates = shard


@contextmanager
def count_whole_gathers(path: Path):
    """While open, the trainer's whole-model gathers for its engines (``full_state_dict``
    called from the training loop, not from a checkpoint) are counted into ``path`` (rank
    0)."""
    from ardea.trainer import loop

    gather, calls = loop.full_state_dict, []

    def counting(*args, **kwargs):
        calls.append(1)
        return gather(*args, **kwargs)

    loop.full_state_dict = counting
    try:
        yield
    finally:
        loop.full_state_dict = gather
        if int(os.environ.get("RANK", "0")) == 0:
            path.write_text(str(len(calls)))


def main(root: Path, names: list[str]) -> None:
    """Run ``names`` (default: every feature) for 3 steps at this launch's world size: FSDP2
    under torchrun, one process otherwise; cases.py's model, batch and float32 settings."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    mode = "fsdp2" if world > 1 else "none"
    os.chdir(REPO)  # the workflow's file path is relative to where the run starts
    for name in names or list(FEATURES):
        extra = tuple(feature_overrides(name, root))
        run_dir = root / str(world) / name
        run_dir.mkdir(parents=True, exist_ok=True)
        with record_micro_batch_groups(run_dir / "micro_batch_groups.json"):
            with count_whole_gathers(run_dir / WHOLE_GATHERS):
                train("online_grpo", run_dir, mode, steps=STEPS, extra=extra)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])

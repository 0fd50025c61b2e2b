"""Every strategy, LoRA and not, under torchrun and in one process: ``python
every_strategy.py ROOT`` runs, at this launch's world size,

- one process: each strategy with its full weights trained, for one step
  (``<ROOT>/1/<algo>``);
- two processes, for each mode (``fsdp2``, ``ddp``: :data:`UNDER`): each case for two steps
  with a checkpoint after each and an evaluation before the first and at the end
  (``trainer.keep_best``: the best checkpoint is saved too) in ``<ROOT>/2/<mode>/<case>``,
  then step 2 again resumed from the step-1 checkpoint (``<ROOT>/2/<mode>/<case>_resumed``).

A case is a strategy (``ALGOS``) with its full weights trained or LoRA adapters
(``<algo>_lora``). Every run records its optimizer steps (cases.py) and writes
``metrics.jsonl`` like any run. The checkpoints are where FSDP2 and LoRA crashed: a held-out
evaluation (a forward without a backward) left FSDP2's root parameters unsharded so the
optimizer's state could not be named, and a LoRA critic could not be copied to be merged.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE)]

from cases import DIGIT_REWARD, first_checkpoint, train  # noqa: E402

#: the arithmetic task: demonstrations, pairs, labeled answers or prompts, as the strategy
#: asks, and held-out ones to evaluate on
TASK = ["data.task=arithmetic", "data.train_size=64"]
ONLINE = [*TASK, "rollout.group_size=4", "rollout.max_new_tokens=6", DIGIT_REWARD]
#: what each strategy trains on: the task, or the example files
ALGOS = {
    "sft": TASK,
    "seq": [
        "data.task=null",
        "data.path=examples/data/text.jsonl",
        "data.eval_path=examples/data/text.jsonl",
        "data.max_length=64",
    ],
    "dpo": TASK,
    "simpo": TASK,
    "orpo": TASK,
    "kto": TASK,
    "reward_model": TASK,
    "grpo": [
        "data.task=null",
        "data.path=examples/data/groups.jsonl",
        "data.eval_path=examples/data/groups.jsonl",
        "data.max_length=256",
    ],
    "online_grpo": ONLINE,
    "online_dpo": ONLINE,
    "online_ppo": [*ONLINE, "algo.ppo.kl_ctl=0.05"],
}
LORA = ["model.lora_r=4", "model.lora_alpha=8"]
#: the strategies run with LoRA too, one per way a LoRA policy is used: offline with no
#: reference (sft), a reference by disabling the adapters (dpo, grpo), a model without an
#: engine (reward_model), an engine that syncs adapters alone (online_grpo) and a LoRA critic
#: (online_ppo). seq, simpo, orpo, kto and online_dpo share those paths; the whole matrix
#: (every strategy with LoRA under both modes) passed at the change that made checkpoints
#: sharded (issue 63) and is one edit of this tuple away.
WITH_LORA = ("sft", "dpo", "grpo", "reward_model", "online_grpo", "online_ppo")
CASES = {**{a: ALGOS[a] for a in ALGOS}, **{f"{a}_lora": [*ALGOS[a], *LORA] for a in WITH_LORA}}
MODES = ("fsdp2", "ddp")
#: the strategies test_torchrun.py already saves and resumes under both modes (across world
#: sizes, with gradient accumulation)
IN_TEST_TORCHRUN = ("sft", "online_ppo")
#: the cases run under each mode: every one under FSDP2, where the parameters are sharded
#: (every crash was there); under DDP, where each rank holds the whole module, the other
#: strategies, and LoRA where its export differs: offline (sft), a LoRA critic (online_ppo)
#: and a model without an engine (reward_model). The full matrix was run once by hand (the
#: closing note of the change that added this file).
UNDER = {
    "fsdp2": tuple(CASES),
    "ddp": (*(a for a in ALGOS if a not in IN_TEST_TORCHRUN), "sft_lora", "online_ppo_lora",
            "reward_model_lora"),
}  # fmt: skip
#: a held-out set (4 examples or prompts), evaluated before step 1 and at the end, and the
#: best checkpoint kept: the saves after an evaluation (the best at step 0, the last) are the
#: ones that crashed
EVALUATED = ["data.eval_size=4", "trainer.eval_every=2", "trainer.keep_best=true"]


def algo_of(case: str) -> str:
    return case.removesuffix("_lora")


def run_case(root: Path, case: str, world: int) -> None:
    extra = (f"algo.name={algo_of(case)}", *CASES[case], *EVALUATED)
    if world == 1:
        if case in ALGOS:
            train(algo_of(case), root / "1" / case, "none", extra=extra, per_algo=False)
        return
    for mode in (m for m in MODES if case in UNDER[m]):
        here = root / "2" / mode
        saving = (*extra, "trainer.save_every=1")
        train(algo_of(case), here / case, mode, steps=2, extra=saving, per_algo=False)
        start = first_checkpoint(here / case)
        train(algo_of(case), here / f"{case}_resumed", mode, steps=2, resume=str(start),
              extra=saving, per_algo=False)  # fmt: skip


def main(root: Path, names: list[str]) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    os.chdir(REPO)  # the example files' paths are relative to the repository
    for case in names or list(CASES):
        run_case(root, case, world)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])

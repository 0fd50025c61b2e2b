"""The runs the distributed tests compare, launched by ``torchrun`` (2 processes) or in the
test process itself (1 process). ``python cases.py PHASE ROOT [MODE ...]``.

Phases:

- ``fresh``: one optimizer step of every strategy (sft and online_ppo in two micro-batches) (``<ROOT>/<world>/<mode>/<algo>``);
- ``reference``: (1 process) the same one step and an uninterrupted two-step run
  (``<ROOT>/1/none/<algo>``, ``<ROOT>/1/none/<algo>_two``);
- ``forever`` (2 processes): a run that only ends when killed (:func:`forever`);
- ``resume``: the second step resumed from the other world size's one-step checkpoint:
  at 2 processes from the one-process run (``<ROOT>/2/<mode>/<algo>_resumed``), in one
  process from the 2-process run of each MODE (``<ROOT>/1/none/<algo>_from_<mode>``).

Every run is float32 with a constant learning rate, so a step's weights depend only on
the global batch and the optimizer state in the checkpoint.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ALGOS = ("sft", "grpo", "online_grpo", "online_ppo")
#: resumed at the other world size: offline, and online with a critic and a reference (the
#: other strategies save and load through the same code)
RESUMED = ("sft", "online_ppo")

#: a completion with a digit scores 1: about half of a random policy's do, so every group
#: has a reward spread and the step is not zero
DIGIT_REWARD = "reward.functions=[{name: format_regex, kwargs: {pattern: '[0-9]'}}]"

COMMON = [
    "model.compute_dtype=float32",
    # llama, not qwen2: a key bias has an exactly-zero gradient (softmax is shift-invariant)
    # that Adam's first step would blow up from rounding noise into a different update
    "model.arch=llama",
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
    "trainer.batch_size=4",
    "trainer.lr=5e-4",  # Adam's first step is ~lr·sign(g): see the tests' docstring
    "trainer.warmup_steps=0",
    "trainer.lr_schedule=constant",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "trainer.num_threads=1",
    "trainer.device=cpu",
    "logging.progress=false",
    "logging.tensorboard=false",
]

PER_ALGO = {
    # sft and online_ppo also accumulate 2 micro-batches: 2 of 2 rows in one process, 2 of 1
    # per rank in two, the same global step by the global-count normalisation
    "sft": [
        "data.task=null",
        "data.path=examples/data/chat.jsonl",
        "data.max_length=256",
        "trainer.grad_accum_steps=2",
    ],
    "grpo": ["data.task=null", "data.path=examples/data/groups.jsonl", "data.max_length=256"],
    "online_grpo": [
        "data.task=arithmetic",
        "data.eval_size=1",
        "data.train_size=64",
        "rollout.group_size=4",
        "rollout.max_new_tokens=6",
        DIGIT_REWARD,
    ],
    "online_ppo": [
        "data.task=arithmetic",
        "data.eval_size=1",
        "data.train_size=64",
        "rollout.group_size=2",
        "rollout.max_new_tokens=6",
        DIGIT_REWARD,
        "algo.ppo.kl_ctl=0.05",
        "trainer.grad_accum_steps=2",
    ],
}


def overrides(algo: str, run_dir: Path, mode: str, steps: int, resume: str) -> list[str]:
    return [
        *COMMON,
        *PER_ALGO[algo],
        f"algo.name={algo}",
        f"trainer.distributed={mode}",
        f"trainer.max_steps={steps}",
        f"trainer.output_dir={run_dir}",
        f"trainer.resume={resume}",
    ]


def train(
    algo: str,
    run_dir: Path,
    mode: str,
    *,
    steps: int = 1,
    resume: str = "never",
    extra: tuple[str, ...] = (),
) -> None:
    """Run ``algo``; a resumed run first writes what it loaded to ``<run_dir>/loaded.pt``
    (whole weights, optimizer and strategy state, gathered as a checkpoint gathers them)."""
    import torch

    from ardea.config import load_config
    from ardea.trainer.distributed import full_state_dict
    from ardea.trainer.loop import Trainer

    trainer = Trainer(load_config(None, [*overrides(algo, run_dir, mode, steps, resume), *extra]))
    if resume != "never":
        loaded = {
            "policy": full_state_dict(trainer.policy, cpu=True),
            "updater": trainer.updater.state_dict(),
            "modules": trainer.strategy.module_states(),
            "strategy": trainer.strategy.state_dict(),
        }
        if trainer.dist.is_main:
            torch.save(loaded, run_dir / "loaded.pt")
    trainer.train()


def final_checkpoint(run_dir: Path) -> Path:
    return sorted((run_dir / "checkpoints").glob("step_*"))[-1]


def main(phases: str, root: Path, modes: list[str]) -> None:
    """Run ``phases`` (names joined by ``+``, in order) for every mode and strategy."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for phase, mode in ((p, m) for p in phases.split("+") for m in modes):
        for algo in ALGOS:
            here = root / str(world) / mode
            if phase == "fresh":
                train(algo, here / algo, mode)
            elif phase == "reference":
                train(algo, here / algo, mode)
                if algo in RESUMED:
                    train(algo, here / f"{algo}_two", mode, steps=2)
            elif algo not in RESUMED:
                continue
            elif phase == "resume" and world > 1:  # from the one-process checkpoint
                start = final_checkpoint(root / "1" / "none" / algo)
                train(algo, here / f"{algo}_resumed", mode, steps=2, resume=str(start))
            elif phase == "resume":  # one process, from the checkpoint of MODE at 2
                start = final_checkpoint(root / "2" / mode / algo)
                out = root / "1" / "none" / f"{algo}_from_{mode}"
                train(algo, out, "none", steps=2, resume=str(start))
            else:
                raise SystemExit(f"unknown phase {phase!r}")


def forever(root: Path, mode: str, extra: list[str]) -> None:
    """An online run that never ends by itself, saving every 2 steps: each rank writes its
    pid to ``<root>/pid_<rank>`` so that a test can kill one."""
    (root / f"pid_{os.environ['RANK']}").write_text(str(os.getpid()))
    saving = ("trainer.save_every=2", "trainer.keep_last=1000", *extra)
    train("online_grpo", root / "run", mode, steps=1_000_000, extra=saving)


if __name__ == "__main__":
    if sys.argv[1] == "forever":
        forever(Path(sys.argv[2]), sys.argv[3], sys.argv[4:])
    else:
        main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:])

"""The runs the distributed tests compare, launched by ``torchrun`` (2 processes) or in the
test process itself (1 process). ``python cases.py PHASE ROOT [MODE ...]``.

Phases:

- ``fresh`` (2 processes) and ``reference`` (1 process): every strategy (sft and online_ppo
  accumulating two micro-batches) for one optimizer step, sft and online_ppo for two with a
  checkpoint after each (``<ROOT>/<world>/<mode>/<algo>``);
- ``forever`` (2 processes): a run that only ends when killed (:func:`forever`);
- ``resume``: the second step resumed from the other world size's step-1 checkpoint:
  at 2 processes from the one-process run (``<ROOT>/2/<mode>/<algo>_resumed``), in one
  process from the 2-process run of each MODE (``<ROOT>/1/none/<algo>_from_<mode>``); and
  under DDP at 2 processes from the FSDP2 run's shard files
  (``<ROOT>/2/ddp/<algo>_from_fsdp2``).

Every run records what each optimizer step was given (:func:`record_optimizer_steps`):
the whole parameters before it, their whole gradients (gathered from FSDP2's shards; after
the all-reduce and clipping) and the optimizer's hyperparameters, in ``<run>/steps.pt``.
Every run is float32 with a constant learning rate, so a step's weights depend only on
the global batch and the optimizer state in the checkpoint.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

ALGOS = ("sft", "grpo", "online_grpo", "online_ppo")
#: resumed at the other world size: offline, and online with a critic and a reference (the
#: other strategies save and load through the same code)
RESUMED = ("sft", "online_ppo")

#: a completion with a digit scores 1: about half of a random policy's do, so every group
#: has a reward spread and the step is not zero
DIGIT_REWARD = "reward.functions=[{name: format_regex, kwargs: {pattern: '[0-9]'}}]"

#: 2 layers of width 32 and 64 (the character vocabulary: 262 tokens)
TINY_MODEL = [
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
]

COMMON = [
    "model.compute_dtype=float32",
    # llama, not qwen2: a key bias has an exactly-zero gradient (softmax is shift-invariant)
    # that Adam's first step would blow up from rounding noise into a different update
    "model.arch=llama",
    *TINY_MODEL,
    "trainer.batch_size=4",
    "trainer.lr=5e-4",
    "trainer.warmup_steps=0",
    "trainer.lr_schedule=constant",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "trainer.num_threads=1",
    "trainer.device=cpu",
    "logging.progress=false",
    "logging.log_every=1",  # every step's gradient norm before clipping, compared by the tests
    "logging.tensorboard=false",
    "logging.report=false",  # no report.png: half a second a run
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


def overrides(
    algo: str, run_dir: Path, mode: str, steps: int, resume: str, per_algo: bool = True
) -> list[str]:
    """The run of ``algo``: COMMON, with ``PER_ALGO[algo]`` unless ``per_algo`` is false (a
    caller that says itself what the run trains on)."""
    return [
        *COMMON,
        *(PER_ALGO[algo] if per_algo else ()),
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
    per_algo: bool = True,
) -> None:
    """Run ``algo`` (:func:`overrides`, then ``extra``), recording its optimizer steps; a
    resumed run first writes what it loaded to ``<run_dir>/loaded.pt`` (whole weights,
    optimizer and strategy state, gathered as a checkpoint gathers them)."""
    import torch

    from ardea.config import load_config
    from ardea.trainer.loop import Trainer
    from ardea.trainer.state_dicts import full_state_dict

    trainer = Trainer(
        load_config(None, [*overrides(algo, run_dir, mode, steps, resume, per_algo), *extra])
    )
    if resume != "never":
        loaded = {
            "policy": full_state_dict(trainer.policy, cpu=True),
            "updater": trainer.updater.state_dict(),
            "modules": trainer.updater.module_weights(keep=trainer.dist.is_main),
        }
        if trainer.dist.is_main:
            torch.save(loaded, run_dir / "loaded.pt")
    with record_optimizer_steps(trainer) as records:
        trainer.train()
    if trainer.dist.is_main:
        torch.save(records, run_dir / "steps.pt")


def whole(tensor):
    """A parameter or gradient as one plain CPU tensor (an FSDP2 DTensor is gathered:
    collective, every rank calls it in the same order)."""
    full_tensor = getattr(tensor, "full_tensor", None)
    return (full_tensor() if callable(full_tensor) else tensor).detach().cpu().clone()


@contextmanager
def record_optimizer_steps(trainer):
    """While open, every optimizer step of ``trainer`` (the policy's, the critic's) appends
    ``{"module", "step", "params", "grads", "hyper"}`` to the yielded list: its training step
    (1-based, as checkpoints count), the whole parameters before the step and their
    gradients by the module's own parameter names (a gradient is None where the optimizer
    skips the parameter), and per parameter its group's ``lr, betas, eps, weight_decay``."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from ardea.trainer.distributed import unwrap

    names = {}
    modules = [("policy", trainer.policy)]
    modules += [(c.prefix, c.module) for c in trainer.updater.components[1:]]
    for label, module in modules:
        for name, param in unwrap(module).named_parameters():
            names[id(param)] = (label, name)
    records: list[dict] = []

    def before_step(optimizer, args, kwargs):
        record = {"step": trainer.step + 1, "params": {}, "grads": {}, "hyper": {}}
        for group in optimizer.param_groups:
            hyper = {k: group[k] for k in ("lr", "betas", "eps", "weight_decay")}
            for param in group["params"]:
                record["module"], name = names[id(param)]
                record["params"][name] = whole(param)
                record["grads"][name] = None if param.grad is None else whole(param.grad)
                record["hyper"][name] = hyper
        records.append(record)

    handle = register_optimizer_step_pre_hook(before_step)
    try:
        yield records
    finally:
        handle.remove()


def first_checkpoint(run_dir: Path) -> Path:
    return sorted((run_dir / "checkpoints").glob("step_*"))[0]


def main(phases: str, root: Path, modes: list[str]) -> None:
    """Run ``phases`` (names joined by ``+``, in order) for every mode and strategy."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for phase, mode in ((p, m) for p in phases.split("+") for m in modes):
        for algo in ALGOS:
            here = root / str(world) / mode
            if phase in ("fresh", "reference"):
                steps = 2 if algo in RESUMED else 1
                train(algo, here / algo, mode, steps=steps, extra=("trainer.save_every=1",))
            elif algo not in RESUMED:
                continue
            elif phase == "resume" and world > 1:  # from the one-process checkpoint
                start = first_checkpoint(root / "1" / "none" / algo)
                train(algo, here / f"{algo}_resumed", mode, steps=2, resume=str(start))
                if mode == "ddp":  # and from FSDP2's shard files, joined
                    start = first_checkpoint(root / "2" / "fsdp2" / algo)
                    train(algo, here / f"{algo}_from_fsdp2", mode, steps=2, resume=str(start))
            elif phase == "resume":  # one process, from the checkpoint of MODE at 2
                start = first_checkpoint(root / "2" / mode / algo)
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

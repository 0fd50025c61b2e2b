"""A run's checkpoint: what it holds beside the policy (the optimizer, scheduler, data
cursor, RNG, evaluation history, best checkpoint, rollouts in flight, the config) and
putting it back, bit for bit, into a :class:`~ardea.trainer.loop.Trainer`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ardea.config import config_to_yaml
from ardea.model.lora import is_lora, load_policy_weights
from ardea.rollout import own_copy
from ardea.trainer.checkpoint import BEST_DIR, checkpoint_dir, load_trainer_state, save_checkpoint
from ardea.trainer.distributed import full_state_dict, unwrap
from ardea.trainer.state import restore_rng_state, rng_state


def save_run(trainer: Any, *, best: bool = False) -> Path:
    """Write ``trainer``'s checkpoint: every rank gathers its shards (collectives), rank 0
    writes and renames it into place, the others wait until it has. ``best``: into
    ``checkpoints/best/`` (``trainer.keep_best``), replacing the one there."""
    state = {
        "step": trainer.step,
        "train_seconds": trainer.train_seconds,
        "updater": trainer.updater.state_dict(),
        "sampler": trainer.sampler.state_dict(),
        "rng": rng_state(),
        "history": trainer.history,
        "best": trainer.best,
        "rollouts": trainer.recipe.state_dict(),
        "config_yaml": config_to_yaml(trainer.config),
    }
    policy_state = full_state_dict(trainer.policy, cpu=True) if trainer.dist.active else None
    modules = trainer.updater.module_weights()
    path = checkpoint_dir(trainer.run_dir, BEST_DIR if best else trainer.step)
    if trainer.dist.is_main:
        policy = unwrap(trainer.policy)
        if trainer.dist.mode == "fsdp2" and is_lora(policy):  # shards: merge a whole copy
            policy = own_copy(trainer.engine_module)
            policy.load_state_dict(policy_state)
        path = save_checkpoint(
            trainer.run_dir,
            trainer.step,
            policy=policy,
            tokenizer=trainer.tokenizer,
            state=state,
            keep_last=trainer.config.trainer.keep_last,
            policy_state=policy_state,
            save_extra=lambda directory: trainer.updater.save_modules(directory, modules),
            final=path,
        )
    trainer.dist.after_main()
    return path


def restore_run(trainer: Any, checkpoint: Path) -> None:
    """Every rank reads ``checkpoint`` into ``trainer`` (whole weights and optimizer state,
    written at any world size) and keeps its shards; the RNG state is rank 0's."""
    state = load_trainer_state(checkpoint)
    load_policy_weights(unwrap(trainer.policy), checkpoint)
    trainer.updater.load_modules(checkpoint)
    trainer.updater.load_state_dict(state["updater"])
    trainer.sampler.load_state_dict(state["sampler"])
    trainer.step = int(state["step"])
    trainer.train_seconds = float(state.get("train_seconds", 0.0))
    trainer.history = state["history"]
    trainer.best = state.get("best")
    trainer.recipe.load_state_dict(state["rollouts"])
    restore_rng_state(state["rng"])

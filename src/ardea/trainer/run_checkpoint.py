"""A run's checkpoint: what it holds beside the policy (the optimizer, scheduler, data
cursor, RNG, evaluation history, best checkpoint, rollouts in flight, the config) and
putting it back, bit for bit, into a :class:`~ardea.trainer.loop.Trainer`.

Who writes what: the writing ranks (``dist.writers``: rank 0, and the first rank of each
node with a disk of its own, :mod:`ardea.trainer.node_disks`) each write a checkpoint
directory on their disk; under FSDP2 every rank adds its shard file
(:mod:`ardea.trainer.shard_files`) to its node's, and only the ranks that write keep a
whole copy of the weights for the Hugging Face export (gathered one tensor at a time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ardea.config import config_to_yaml
from ardea.model.lora import is_lora, load_policy_weights
from ardea.rollout import own_copy
from ardea.trainer.checkpoint import (
    BEST_DIR,
    begin_checkpoint,
    checkpoint_dir,
    finish_checkpoint,
    load_trainer_state,
    temporary_dir,
    write_checkpoint,
)
from ardea.trainer.distributed import unwrap
from ardea.trainer.shard_files import read_shards, shard_world_size, write_shard
from ardea.trainer.state import restore_rng_state, rng_state
from ardea.trainer.state_dicts import gathered_state


def save_run(trainer: Any, *, best: bool = False) -> Path:
    """Write ``trainer``'s checkpoint (every rank calls it; module docstring) and return its
    path. ``best``: into ``checkpoints/best/`` (``trainer.keep_best``), replacing the one
    there."""
    dist = trainer.dist
    sharded, writes = dist.mode == "fsdp2", dist.rank in dist.writers
    final = checkpoint_dir(trainer.run_dir, BEST_DIR if best else trainer.step)
    state = run_state(trainer, sharded=sharded, writes=writes)  # a collective (rollouts ahead)
    # the whole weights for the export (under FSDP2 a collective, kept by the writers)
    policy_state = gathered_state(trainer.policy, keep=writes) if sharded else None
    modules = trainer.updater.module_weights(keep=writes) if writes or sharded else {}
    tmp = begin_checkpoint(final) if writes else temporary_dir(final)
    if sharded:
        dist.after(dist.writers)  # every node's temporary directory is there
        write_shard(tmp, trainer.updater.components, dist.rank, dist.world_size)
        dist.after(list(range(dist.world_size)))
    if writes:
        policy = unwrap(trainer.policy)
        if sharded and is_lora(policy):  # shards: merge a whole copy
            policy = own_copy(trainer.engine_module)
            policy.load_state_dict(policy_state)
        write_checkpoint(
            tmp,
            policy=policy,
            tokenizer=trainer.tokenizer,
            state=state,
            policy_state=policy_state,
            save_extra=lambda directory: trainer.updater.save_modules(directory, modules),
        )
        finish_checkpoint(
            tmp,
            final,
            trainer.step,
            run_dir=trainer.run_dir,
            keep_last=trainer.config.trainer.keep_last,
        )
    dist.after(dist.writers)
    return final


def run_state(trainer: Any, *, sharded: bool, writes: bool) -> dict[str, Any]:
    """``trainer_state.pt``: everything but the weights (every rank calls it; the optimizer
    state is taken by the ranks that write alone: ``sharded``, its hyperparameters without
    the moments, which are in the shard files)."""
    return {
        "step": trainer.step,
        "train_seconds": trainer.train_seconds,
        "updater": trainer.updater.state_dict(sharded=sharded) if writes else {},
        "sampler": trainer.sampler.state_dict(),
        "rng": rng_state(),
        "history": trainer.history,
        "best": trainer.best,
        "rollouts": trainer.recipe.state_dict(),
        "config_yaml": config_to_yaml(trainer.config),
    }


def restore_run(trainer: Any, checkpoint: Path) -> None:
    """Every rank reads ``checkpoint`` into ``trainer``: from a checkpoint written whole,
    the whole weights and optimizer state (any world size); from shard files, this rank's
    own at the world size that wrote them, else the shards joined whole. The RNG state is
    rank 0's."""
    state = load_trainer_state(checkpoint)
    dist, updater = trainer.dist, trainer.updater
    saved_world = shard_world_size(checkpoint)
    if saved_world is None:
        load_policy_weights(unwrap(trainer.policy), checkpoint)
        updater.load_modules(checkpoint)
        updater.load_state_dict(state["updater"])
    else:  # this rank's own file when it is sharded as the ranks that wrote them were
        own = dist.mode == "fsdp2" and saved_world == dist.world_size
        moments = read_shards(checkpoint, updater.components, dist.rank, saved_world, own=own)
        for prefix, stored in state["updater"]["components"].items():
            stored["optimizer"]["state"] = moments.get(prefix, {})
        updater.load_state_dict(state["updater"], sharded=own)
    trainer.sampler.load_state_dict(state["sampler"])
    trainer.step = int(state["step"])
    trainer.train_seconds = float(state.get("train_seconds", 0.0))
    trainer.history = state["history"]
    trainer.best = state.get("best")
    trainer.recipe.load_state_dict(state["rollouts"])
    restore_rng_state(state["rng"])

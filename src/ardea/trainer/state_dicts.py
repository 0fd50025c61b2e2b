"""A wrapped module's tensors by name, as checkpoints and engines read them: whole
(gathered from FSDP2's shards, or a replica's own), this rank's own (``DTensor`` shards
under FSDP2), and loading either back. Every function takes the module as the trainer
holds it (plain, DDP- or FSDP2-wrapped) and names tensors as the unwrapped model does."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule

from ardea.rollout.checks import whole
from ardea.trainer.distributed import unwrap

FULL = StateDictOptions(full_state_dict=True)
FULL_ON_CPU = StateDictOptions(full_state_dict=True, cpu_offload=True)
LOCAL_ON_CPU = StateDictOptions(cpu_offload=True)  # a replica's own tensors, copied to CPU


def resharded(module: nn.Module) -> nn.Module:
    """``module`` with every FSDP2 sub-module back in its sharded state. FSDP2 leaves the root
    module's parameters (embeddings, final norm, LM head) unsharded after a forward without
    a backward (the root does not reshard after forward, to save an all-gather before the
    backward): an evaluation, a no-grad scoring pass. The module then holds plain tensors
    where the optimizer holds the sharded parameters, and a state dict taken in that state
    cannot map the optimizer's parameters to names. Not a collective (resharding frees the
    gathered copy)."""
    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            sub.reshard()
    return module


def full_state_dict(
    module: nn.Module, *, cpu: bool = False, trained_only: bool = False
) -> dict[str, torch.Tensor]:
    """The whole model's tensors by name (collective under FSDP2). With ``cpu``, copies on
    CPU: of a sharded module rank 0 gets them and the other ranks an empty dict, of a
    replicated one every rank its own (no collective); with ``trained_only``, the
    parameters that require gradients alone (a LoRA policy's adapters: its frozen base is
    neither gathered nor copied)."""
    resharded(module)
    options = FULL
    if cpu:
        options = FULL_ON_CPU if is_sharded(module) else LOCAL_ON_CPU
    if trained_only:
        options = dataclasses.replace(options, ignore_frozen_params=True)
    return get_model_state_dict(module, options=options)


def gathered_state(module: nn.Module, *, keep: bool) -> dict[str, torch.Tensor]:
    """The whole model's tensors by name on CPU where ``keep`` (the ranks that write a
    checkpoint's Hugging Face export), {} elsewhere. A sharded module is gathered one
    tensor at a time (a collective: every rank calls it), so a rank that keeps nothing
    never holds more than one whole tensor; a replicated one is copied by the ranks that
    keep it (no collective)."""
    out: dict[str, torch.Tensor] = {}
    if not is_sharded(module):
        return full_state_dict(module, cpu=True) if keep else out
    for name, tensor in local_state_dict(module).items():
        full = whole(tensor)
        if keep:
            out[name] = full.detach().to("cpu", copy=True)
    return out


def is_sharded(module: nn.Module) -> bool:
    """Whether FSDP2 shards ``module`` (its state is spread over the ranks)."""
    return any(isinstance(sub, FSDPModule) for sub in module.modules())


def local_state_dict(module: nn.Module, *, trained_only: bool = False) -> dict[str, torch.Tensor]:
    """The model's tensors by name as this rank holds them, nothing gathered: under FSDP2
    each parameter a ``DTensor`` shard, which a reader gathers whole one tensor at a time
    (:func:`ardea.rollout.checks.whole`, a collective: every rank reads them in this
    order); else its own tensors. ``trained_only``: the parameters that require gradients
    alone (a LoRA policy's adapters)."""
    resharded(module)
    state = unwrap(module).state_dict()
    if not trained_only:
        return state
    trained = {name for name, param in unwrap(module).named_parameters() if param.requires_grad}
    return {name: tensor for name, tensor in state.items() if name in trained}


def load_full_state_dict(module: nn.Module, state: Mapping[str, torch.Tensor]) -> Any:
    """Load a whole-model ``state`` (every rank passes it) into ``module``; returns the
    missing and unexpected keys."""
    resharded(module)
    options = StateDictOptions(full_state_dict=True, strict=False)
    return set_model_state_dict(module, dict(state), options=options)


def optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state keyed by parameter name, whole (not sharded): loadable at any
    world size. Under FSDP2 a collective after which rank 0 holds it on CPU and the other
    ranks an empty dict; a replicated module's (one process, DDP) is every rank's own copy
    on CPU (no collective: a node with a disk of its own writes it).

    An optimizer that has not stepped yet (a checkpoint before the first update: the best
    one after the evaluation at step 0) is saved with no state and left with none.
    ``get_optimizer_state_dict`` would initialise it by stepping it once with zero gradients
    at learning rate 0: the weights stay, but Adam's step count becomes 1, so the first real
    update would be bias-corrected as a second one (a quarter smaller at beta2 = 0.98) and a
    run that saved at step 0 would train differently from one that did not."""
    resharded(module)
    if optimizer.state:
        options = FULL_ON_CPU if is_sharded(module) else LOCAL_ON_CPU
        return get_optimizer_state_dict(module, optimizer, options=options)
    if is_sharded(module) and dist.get_rank() != 0:
        return {}
    return optimizer_groups(module, optimizer)


def optimizer_groups(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's hyperparameters with its parameters by name and no moments: what a
    sharded checkpoint keeps beside the moments in its rank files (not a collective)."""
    resharded(module)  # after a forward alone the root's parameters are not the optimizer's
    names = {id(param): name for name, param in unwrap(module).named_parameters()}
    groups = [
        {**{k: v for k, v in group.items() if k != "params"},
         "params": [names[id(param)] for param in group["params"]]}
        for group in optimizer.param_groups
    ]  # fmt: skip
    return {"state": {}, "param_groups": groups}


def load_optimizer_state(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    *,
    sharded: bool = False,
) -> None:
    """Load what :func:`optimizer_state` gave (every rank passes the whole state), or with
    ``sharded`` this rank's FSDP2 shards of it (``DTensor`` moments); a state saved before
    the first step leaves the optimizer without one, as it was."""
    resharded(module)
    options = StateDictOptions() if sharded else FULL
    set_optimizer_state_dict(module, optimizer, optim_state_dict=state, options=options)
    if not state["state"]:  # the helper stepped it once at lr 0 to have a state to fill
        optimizer.state.clear()

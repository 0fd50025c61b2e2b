"""Sharded training state: under FSDP2 each rank writes the parameters and optimizer moments
it holds into ``shards/rank_RRRRR-of-WWWWW.safetensors`` of the checkpoint, and reads its own
back when the run resumes at the same world size — no rank ever gathers the training state
whole, and a node that does not share a disk with the others needs only its own ranks'
files.

A file holds, for every trained component (the policy, the critic), ``<prefix>/model/<name>``
(its trained parameters and buffers: frozen ones are rebuilt from their source when the run
starts, as a LoRA resume rebuilds the base) and ``<prefix>/optim/<name>/<key>`` (Adam's
``step``, ``exp_avg``, ``exp_avg_sq``), ``prefix`` being the component's metrics prefix
(``train``, ``critic``) and ``name`` the unwrapped model's parameter name. Its header's
``layout`` maps each tensor to its whole shape and whether it is split along dimension 0
in rank order (FSDP2's ``Shard(0)``) or held whole by every rank. The optimizer's
hyperparameters by parameter name stay in ``trainer_state.pt``.

Resuming at another world size (or without torchrun) joins the shards of every rank along
dimension 0 into whole tensors, which needs every rank's file in the checkpoint (a shared
disk, or the files copied together): that path holds the whole training state on every
rank once, as a checkpoint written whole does.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
)
from torch.distributed.tensor import DTensor, Shard

from ardea.errors import ArdeaError
from ardea.trainer.state_dicts import load_full_state_dict, resharded

SHARDS_DIR = "shards"
#: this rank's tensors as they are (DTensor shards under FSDP2), frozen parameters left out
TRAINED = StateDictOptions(ignore_frozen_params=True)
FILE_NAME = re.compile(r"^rank_(\d{5})-of-(\d{5})\.safetensors$")


def shard_path(checkpoint: Path, rank: int, world_size: int) -> Path:
    return Path(checkpoint) / SHARDS_DIR / f"rank_{rank:05d}-of-{world_size:05d}.safetensors"


def training_tensors(component: Any) -> dict[str, torch.Tensor]:
    """``component``'s trained parameters, buffers and optimizer moments as this rank holds
    them, by shard-file name (module docstring). An optimizer that has not stepped has no
    moments (asking for them would step it once: :func:`ardea.trainer.state_dicts.optimizer_state`)."""
    module, prefix = resharded(component.module), component.prefix
    model = get_model_state_dict(module, options=TRAINED)
    out = {f"{prefix}/model/{name}": tensor for name, tensor in model.items()}
    if component.optimizer.state:
        optim = get_optimizer_state_dict(module, component.optimizer, options=TRAINED)
        for name, moments in optim["state"].items():
            out |= {f"{prefix}/optim/{name}/{key}": value for key, value in moments.items()}
    return out


def write_shard(checkpoint: Path, components: list[Any], rank: int, world_size: int) -> Path:
    """Write this rank's file of ``checkpoint`` (its directory under construction); the
    file's path. Not a collective."""
    tensors, layout = {}, {}
    for component in components:
        for name, value in training_tensors(component).items():
            local = value.to_local() if isinstance(value, DTensor) else value
            tensors[name] = local.detach().to("cpu", copy=True).contiguous()
            layout[name] = [list(value.shape), split_along_rows(value, name)]
    path = shard_path(checkpoint, rank, world_size)
    path.parent.mkdir(exist_ok=True)
    save_file(tensors, str(path), metadata={"layout": json.dumps(layout)})
    return path


def split_along_rows(value: torch.Tensor, name: str) -> bool:
    """Whether ``value`` is split over the ranks along dimension 0 (else each holds it whole)."""
    if not isinstance(value, DTensor):
        return False
    if tuple(value.placements) == (Shard(0),):
        return True
    if all(not p.is_shard() for p in value.placements):
        return False
    raise ArdeaError(f"{name} is sharded as {value.placements}: a checkpoint shards dim 0 only")


def shard_world_size(checkpoint: Path) -> int | None:
    """The world size that wrote ``checkpoint``'s shard files; None for a checkpoint written
    whole (one process, DDP)."""
    directory = Path(checkpoint) / SHARDS_DIR
    sizes = {int(m.group(2)) for f in directory.glob("*") if (m := FILE_NAME.match(f.name))}
    if len(sizes) > 1:
        raise ArdeaError(f"{directory} mixes the files of world sizes {sorted(sizes)}")
    return sizes.pop() if sizes else None


def read_shards(
    checkpoint: Path, components: list[Any], rank: int, saved_world: int, *, own: bool
) -> dict[str, dict[str, Any]]:
    """Load ``checkpoint``'s sharded weights (written by ``saved_world`` ranks) into
    ``components`` and return each one's optimizer moments by parameter name (``{prefix:
    {name: {key: tensor}}}``): with ``own`` (FSDP2 at the world size that wrote them, every
    component sharded alike) this rank's shards, else whole tensors joined from every
    rank's file. Every rank calls it."""
    if own:
        path = shard_path(checkpoint, rank, saved_world)
        if not path.is_file():
            raise ArdeaError(
                f"checkpoint {checkpoint} has no {SHARDS_DIR}/{path.name}: rank {rank}'s "
                "weights and optimizer state were written on another node; copy that node's "
                "file here"
            )
        tensors = _read(path)
        return {c.prefix: _load_own(c, tensors) for c in components}
    tensors = joined(checkpoint, saved_world)
    return {c.prefix: _load_whole(c, tensors) for c in components}


def joined(checkpoint: Path, world_size: int) -> dict[str, torch.Tensor]:
    """Every tensor of ``checkpoint``'s shard files whole: split tensors concatenated along
    dimension 0 in rank order, the others rank 0's."""
    paths = [shard_path(checkpoint, r, world_size) for r in range(world_size)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ArdeaError(
            f"checkpoint {checkpoint} was written by {world_size} processes and lacks "
            f"{SHARDS_DIR}/{', '.join(missing)}: resuming at another number of processes needs "
            f"every rank's file in one directory (copy them together), or resume with "
            f"{world_size} processes"
        )
    files = [_read(p) for p in paths]
    layout = json.loads(_metadata(paths[0])["layout"])
    out = {}
    for name, (shape, split) in layout.items():
        out[name] = torch.cat([f[name] for f in files]) if split else files[0][name]
        if list(out[name].shape) != shape:
            raise ArdeaError(
                f"{name} in {checkpoint} joins to {list(out[name].shape)}, not {shape}"
            )
    return out


def _read(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118


def _metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as f:
        return f.metadata() or {}


def _parts(component: Any, tensors: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """``component``'s weights and optimizer moments among a file's ``tensors``."""
    model, moments = {}, {}
    for name, tensor in tensors.items():
        prefix, kind, rest = name.split("/", 2)
        if prefix != component.prefix:
            continue
        if kind == "model":
            model[rest] = tensor
        else:
            parameter, key = rest.rsplit("/", 1)
            moments.setdefault(parameter, {})[key] = tensor
    return model, moments


def _load_own(component: Any, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """This rank's shards into ``component``; its moments as ``DTensor`` shards laid out as
    their parameters."""
    module = resharded(component.module)
    held = get_model_state_dict(module, options=TRAINED)
    model, moments = _parts(component, tensors)
    missing = sorted(set(held) - set(model))
    if missing:
        raise ArdeaError(f"the shard file has no {component.prefix} weights for {missing[:3]}")
    set_model_state_dict(
        module,
        {name: _like(model[name], held[name]) for name in held},
        options=StateDictOptions(strict=False),
    )
    return {
        name: {key: _like(t, held[name]) if t.dim() else t for key, t in entries.items()}
        for name, entries in moments.items()
    }


def _like(local: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """``local`` (a saved shard) placed as ``held`` (this rank's tensor) is."""
    local = local.to(held.device)
    if not isinstance(held, DTensor):
        return local
    return DTensor.from_local(
        local, held.device_mesh, held.placements, run_check=False, shape=held.shape,
        stride=held.stride(),
    )  # fmt: skip


def _load_whole(component: Any, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Whole tensors into ``component`` (sharded as it is now); its moments whole."""
    model, moments = _parts(component, tensors)
    _, unexpected = load_full_state_dict(component.module, model)  # frozen ones: from source
    if unexpected:
        raise ArdeaError(
            f"the shard files' {component.prefix} weights do not fit: {unexpected[:3]}"
        )
    return moments

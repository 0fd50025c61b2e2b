"""What every engine checks: prompts against its vocabulary and context, a new version
against the current one, and a state dict against its model's; weights read from a mapping
or a directory of safetensors files (never a pickle)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence, Set
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor

from ardea.errors import ConfigError

Weights = Mapping[str, torch.Tensor] | str | os.PathLike


def check_next_version(version: object, current: int) -> None:
    """Raise ValueError unless ``version`` is an int above ``current``: a version names one
    set of weights, and an engine's versions only grow."""
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"version must be an int, got {version!r}")
    if version <= current:
        raise ValueError(f"version must increase: got {version}, current version is {current}")


def load_weights(weights: Weights) -> Mapping[str, torch.Tensor]:
    """``weights`` as named tensors: a mapping as it is, or every ``*.safetensors`` file of a
    directory (never a pickle), merged; an error names a path without any."""
    if isinstance(weights, Mapping):
        return weights
    path = Path(weights)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        raise ValueError(f"no *.safetensors weights in {str(path)!r}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(file))
    return tensors


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor as a whole: a ``DTensor`` (an FSDP2 shard of a trainer's parameter) is
    all-gathered on its device, so every rank must read the same tensors in the same order;
    any other tensor is itself. Engines read a sharded trainer's weights one tensor at a
    time, so that no rank ever holds a second whole copy of the model."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def request_input(request: Any) -> tuple[list[int], int]:
    """A request's input ids (its prompt, then its prefix's tokens) and the tokens it may
    still generate: what an engine checks with :func:`check_prompts`."""
    prefix = [] if request.prefix is None else list(request.prefix.token_ids)
    return list(request.prompt_ids) + prefix, request.params.max_new_tokens - len(prefix)


def check_prompts(
    prompts: Sequence[Sequence[int]],
    *,
    vocab_size: int,
    max_new_tokens: int,
    max_positions: int | None,
) -> None:
    """Raise ValueError naming the prompt index for an empty prompt, a token id outside
    ``[0, vocab_size)``, or ``len(prompt) + max_new_tokens > max_positions``."""
    if isinstance(prompts, str | bytes | torch.Tensor) or not isinstance(prompts, Sequence):
        raise ValueError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str | bytes) or not isinstance(prompt, Sequence):
            raise ValueError(f"prompts[{i}] must be a list of token ids, got {prompt!r:.60}")
        if len(prompt) == 0:
            raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token")
        bad = next((t for t in prompt if not isinstance(t, int)), None)
        if bad is None:
            bad = next((t for t in (min(prompt), max(prompt)) if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ValueError(
                f"prompts[{i}] contains token id {bad!r}; ids must be ints in "
                f"[0, {vocab_size}) (the model's vocabulary size)"
            )
        if max_positions is not None and len(prompt) + max_new_tokens > max_positions:
            raise ValueError(
                f"prompts[{i}] has {len(prompt)} tokens; with max_new_tokens={max_new_tokens} "
                f"that is {len(prompt) + max_new_tokens} positions, beyond the model's "
                f"max_position_embeddings={max_positions}. Shorten the prompt or lower "
                "max_new_tokens."
            )


def check_state_dict(
    own: Mapping[str, torch.Tensor],
    state_dict: Mapping[str, torch.Tensor],
    *,
    frozen: Set[str] = frozenset(),
) -> None:
    """Raise ValueError unless ``state_dict`` can replace ``own`` (a model's state dict)
    exactly: no missing, unexpected or mis-shaped tensors. A key may be missing only if in
    ``own`` it aliases (shares storage with) a key that is present, as tied embeddings do,
    or if it is in ``frozen`` (tensors the model does not train, e.g. a LoRA policy's base:
    the model keeps its own)."""
    unexpected = sorted(set(state_dict) - set(own))
    present = {own[k].data_ptr() for k in state_dict if k in own}
    missing = sorted(
        k for k in own if k not in state_dict and own[k].data_ptr() not in present
        and k not in frozen
    )  # fmt: skip
    shapes = [
        f"{k}: {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in state_dict.items()
        if k in own and tuple(v.shape) != tuple(own[k].shape)
    ]
    if unexpected or missing or shapes:
        raise ValueError(
            "state_dict does not match the model: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}, shape mismatches {shapes[:5]}"
        )


def is_peft(module: object) -> bool:
    """Whether ``module`` is a ``peft`` model (LoRA adapters on a frozen base)."""
    return hasattr(module, "peft_config") and hasattr(module, "get_base_model")


def frozen_base(module: torch.nn.Module) -> frozenset[str]:
    """The state-dict keys of a LoRA policy's frozen base (every key but its adapters'),
    which a weight sync may leave out; empty for any other model."""
    if not is_peft(module):
        return frozenset()
    return frozenset(k for k in module.state_dict() if "lora_" not in k)


def check_routed(params: Any, completions: Sequence[Any], engine: object) -> None:
    """Completions asked for their routed experts (routing replay) carry them: an engine
    that leaves them out would have the run train without the replay it was told to do."""
    if params.routed_experts and any(c.routed_experts is None for c in completions):
        raise ConfigError(
            f"the {type(engine).__name__} returned completions without the experts each "
            "token was routed to, which algo.moe_routing_replay replays; use "
            "rollout.engine=in_process"
        )

"""LoRA adapters through ``peft``, and exporting them separately or merged.

``apply_lora`` wraps a causal LM in a ``peft`` model whose only trainable weights are
the low-rank adapters (``W + (alpha / r)·B·A`` on the named modules); ``lora_critic`` does
the same to a critic's backbone (its value head trained in full). ``save_policy``
writes what other tools load: for a LoRA policy, the merged full model (plain
``transformers``/vLLM) *and* the adapter alone (``peft``); otherwise the model itself.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from transformers import AutoModelForCausalLM

from ardea.errors import ArdeaError
from ardea.model.value import ValueModel

ADAPTER_DIR = "adapter"
POLICY_DIR = "policy"


def apply_lora(
    model: torch.nn.Module,
    *,
    r: int,
    alpha: float,
    dropout: float,
    target_modules: list[str],
    task_type: str = "CAUSAL_LM",
) -> PeftModel:
    """Freeze ``model`` and add rank-``r`` adapters on ``target_modules``; ``task_type``
    ``SEQ_CLS`` (a reward model) also trains the score head in full."""
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [m for m in target_modules if m not in present]
    if missing:
        raise ArdeaError(
            f"model.lora_target_modules names {missing} which the model does not have; "
            f"linear layers include e.g. {sorted(n for n in present if n.endswith('proj'))}"
        )
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        task_type=task_type,
    )
    return get_peft_model(model, config)


def is_lora(model: Any) -> bool:
    return isinstance(model, PeftModel)


def lora_critic(critic: Any, *, r: int, alpha: float, dropout: float,
                target_modules: list[str]) -> Any:  # fmt: skip
    """``critic`` (a :class:`~ardea.model.ValueModel`) with rank-``r`` adapters on its
    backbone's ``target_modules`` (its base weights frozen) and its value head trained in
    full: the critic of a LoRA run keeps an optimizer state as small as the policy's."""
    critic.model = apply_lora(
        critic.model, r=r, alpha=alpha, dropout=dropout, target_modules=target_modules,
        task_type="FEATURE_EXTRACTION",
    )  # fmt: skip
    critic.value_head.requires_grad_(True)
    return critic


def merged_critic(critic: Any, state: dict[str, torch.Tensor]) -> Any:
    """A plain critic holding ``state`` (the LoRA ``critic``'s whole tensors by name, e.g.
    gathered from FSDP2 shards) with the adapters merged into the backbone, to save for other
    tools. Built anew from ``critic``'s config and LoRA settings, never copied from
    ``critic`` itself: a sharded or wrapped module cannot be deep-copied (FSDP2 refuses), and
    its own tensors may be shards. The new module is made on the meta device and takes
    copies of ``state``'s tensors: merging adds ``B·A`` into the base weights in place, and
    ``state`` may share storage with the live critic (a one-process state dict does)."""
    lora = copy.deepcopy(critic.model.peft_config["default"])
    with torch.device("meta"):
        plain = ValueModel(copy.deepcopy(critic.config))
        plain.model = get_peft_model(plain.model, lora)
    copies = {name: tensor.detach().clone() for name, tensor in state.items()}
    missing, unexpected = plain.load_state_dict(copies, strict=False, assign=True)
    if missing or unexpected:
        raise ArdeaError(
            f"the critic's state does not fit its LoRA layout: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}"
        )
    plain.model = plain.model.merge_and_unload()
    return plain


def save_policy(
    model: Any, tokenizer: Any, directory: Path, *, state_dict: dict[str, Any] | None = None
) -> None:
    """Write ``directory/policy`` (full model, safetensors) and, for LoRA, ``directory/adapter``.
    ``state_dict``: the whole model's tensors when ``model``'s own are shards (FSDP2)."""
    directory = Path(directory)
    if is_lora(model):
        # the adapters only: not the base embeddings or head peft would add when they are
        # LoRA targets (the base is loaded from its own directory)
        model.save_pretrained(directory / ADAPTER_DIR, save_embedding_layers=False)
        merged = copy.deepcopy(model).merge_and_unload()
        save_here(merged, directory / POLICY_DIR)
    else:
        save_here(model, directory / POLICY_DIR, state_dict=state_dict)
    tokenizer.save_pretrained(directory / POLICY_DIR)


def save_here(model: Any, directory: Path, **kwargs: Any) -> None:
    """``model.save_pretrained`` (safetensors) in this process whatever its rank: under an
    initialised process group transformers writes on rank 0 alone, but the caller decides
    who writes (a node with a disk of its own writes its copy too)."""
    model.should_save_on_this_rank = lambda is_main_process: is_main_process
    try:
        model.save_pretrained(directory, safe_serialization=True, **kwargs)
    finally:
        del model.should_save_on_this_rank


def load_policy_weights(model: Any, directory: Path) -> None:
    """Load the trainable weights saved by :func:`save_policy` into ``model`` in place
    (plain or sharded with FSDP2; every process reads the files)."""
    directory = Path(directory)
    if is_lora(model):
        state = load_file(directory / ADAPTER_DIR / "adapter_model.safetensors")
        result = set_peft_model_state_dict(model, state)
        if getattr(result, "unexpected_keys", None):
            raise ArdeaError(
                f"adapter in {directory} does not fit the model: {result.unexpected_keys[:3]}"
            )
        return
    files = sorted((directory / POLICY_DIR).glob("*.safetensors"))
    if not files:
        raise ArdeaError(f"no safetensors weights in {directory / POLICY_DIR}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    # whole tensors in, each rank keeps its shards when the model is sharded (FSDP2)
    options = StateDictOptions(full_state_dict=True, strict=False)
    if not set(state) <= set(model.state_dict()):
        state = _converted(directory / POLICY_DIR, state)
    missing, unexpected = set_model_state_dict(model, state, options=options)
    tied = {
        k for k in missing if "lm_head" in k and getattr(model.config, "tie_word_embeddings", False)
    }
    if set(missing) - tied or unexpected:
        raise ArdeaError(
            f"checkpoint {directory} does not fit the model: missing {sorted(set(missing) - tied)[:3]}, "
            f"unexpected {unexpected[:3]}"
        )


def _converted(directory: Path, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The saved ``state`` in the layout the model holds in memory, for families whose
    ``save_pretrained`` writes another (transformers' MoE families store each expert's
    projections apart and fuse them when loading): loaded by transformers itself, on the CPU
    in the saved dtype."""
    dtype = next(iter(state.values())).dtype
    loaded = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, device_map="cpu")
    return loaded.state_dict()

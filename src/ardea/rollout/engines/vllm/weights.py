"""The files vLLM servers load: the model directory they start from, the policy's full
weights, or for a LoRA policy only its adapter; and the live policy's side of a sync (its
module adopting the weights, its log-probs for the sync probe).

Full weights: one safetensors file in the model directory (``lm_head.weight`` written out
for a tied head: vLLM keeps its old head when the file lacks it), which every server
reloads (``/collective_rpc reload_weights``), in the layout of the family's checkpoints
(:func:`checkpoint_layout`: transformers fuses an MoE layer's experts into one tensor in
memory; vLLM loads the per-expert tensors ``save_pretrained`` writes and ignores names it
does not know).

A LoRA policy (a ``peft`` model): the servers start on its frozen base weights once (the
``peft`` names mapped back to the base model's: ``q_proj.base_layer.weight`` →
``q_proj.weight``) and each sync writes the adapter alone (``adapter_config.json`` and
``adapter_model.safetensors``, as ``peft`` saves it) into ``adapter/``, which every server
loads in place with vLLM's runtime LoRA API (``POST /v1/load_lora_adapter``, ``load_inplace``;
servers started with ``--enable-lora --max-lora-rank R`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, which ardea passes to the servers it launches)
and requests name it (``model: ardea-lora``). Bytes moved per sync: the adapter's, not the
model's.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers.core_model_loading import revert_weight_conversion

from ardea.errors import ConfigError
from ardea.model.unwrap import unwrap_peft
from ardea.rollout.engines.vllm.server import VLLMServerError

WEIGHTS_FILE = "model.safetensors"
ADAPTER_DIR = "adapter"
LORA_NAME = "ardea-lora"
#: what a server needs to take LoRA adapters at runtime (flags, environment)
LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def checkpoint_layout(
    module: torch.nn.Module, weights: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``weights`` (the module's in-memory names) as ``save_pretrained`` writes them:
    transformers' own reverse of the conversions it applies when loading (per-expert tensors
    of fused MoE experts; nothing for most dense families)."""
    return revert_weight_conversion(unwrap_peft(module), dict(weights))


def write_weights(directory: Path, weights: Mapping[str, torch.Tensor]) -> Path:
    """``weights`` as one safetensors file in ``directory`` (module docstring); its path."""
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in weights.items()}
    if "lm_head.weight" not in tensors:
        embedding = next((k for k in tensors if k.endswith("embed_tokens.weight")), None)
        if embedding is not None:
            tensors["lm_head.weight"] = tensors[embedding].clone()
    path = Path(directory) / WEIGHTS_FILE
    save_file(tensors, str(path))
    return path


def write_model_dir(
    directory: Path, spec: Any, module: Any, weights: Mapping[str, torch.Tensor]
) -> None:
    """The model directory servers start from: ``spec``'s config and tokenizer, the
    module's generation config, ``weights``."""
    directory.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(spec.model_config)
    if not getattr(config, "architectures", None):  # a model built from a config has none
        config.architectures = [type(unwrap_peft(module)).__name__]  # vLLM picks its class by it
    config.save_pretrained(directory)
    spec.tokenizer.save_pretrained(directory)
    generation = getattr(module, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(directory)
    write_weights(directory, checkpoint_layout(module, weights))


@torch.no_grad()
def adopt(module: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Load ``tensors`` into the engine's ``module`` (which the sync probe reads), as the
    in-process engine does; free when they are its own (the trainer's live policy)."""
    own = module.state_dict()
    for name, tensor in tensors.items():
        if name in own and own[name].data_ptr() != tensor.data_ptr():
            own[name].copy_(tensor)


@torch.no_grad()
def policy_logprobs(module: torch.nn.Module, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """``(T,)`` log-probs of ``tokens`` after ``prompt`` under the live policy ``module``
    (eval mode, float32 softmax at temperature 1: the sync probe is greedy)."""
    device = next(module.parameters()).device
    ids = torch.tensor([prompt + tokens], device=device)
    training = module.training
    module.eval()
    try:
        logits = module(input_ids=ids).logits.float()[0, len(prompt) - 1 : -1]
    finally:
        module.train(training)
    own = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(prompt) :, None])
    return own[:, 0].cpu()


def probe_gap(module: torch.nn.Module, prompt: list[int], choice: dict[str, Any]) -> float:
    """The largest |difference| between a server's log-probs of the tokens it generated
    after ``prompt`` (its reply's ``choice``) and ``module``'s own."""
    ids = [int(t) for t in choice["token_ids"]]
    served = [float(x) for x in choice["logprobs"]["token_logprobs"]]
    if len(served) != len(ids):
        raise VLLMServerError(
            f"a vLLM server returned {len(ids)} tokens but {len(served)} log-probs"
        )
    own = policy_logprobs(module, prompt, ids)
    return float((own - torch.tensor(served)).abs().max())


class AdapterSync:
    """The adapter side of a LoRA policy's servers (module docstring)."""

    def __init__(self, module: Any, work_dir: Path, transport: str = "file") -> None:
        if transport != "file":
            raise ConfigError(
                "a LoRA policy's adapter reaches the vLLM servers as a path (vLLM's "
                f"/v1/load_lora_adapter), not rollout.vllm.weight_transport={transport}: set "
                "it to file, on a filesystem the servers share"
            )
        config = module.peft_config.get("default")
        if config is None or getattr(config, "peft_type", None) is None:
            raise ValueError("the vllm engine syncs LoRA adapters of peft's 'default' adapter")
        self.module, self.config = module, config
        self.directory = Path(work_dir) / ADAPTER_DIR
        self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def rank(self) -> int:
        return int(self.config.r)

    def server_args(self) -> list[str]:
        return ["--enable-lora", "--max-lora-rank", str(_vllm_rank(self.rank)), "--max-loras", "1"]

    def base_weights(self) -> dict[str, torch.Tensor]:
        """The frozen base model's tensors under its own names (no adapter tensors)."""
        base = self.module.get_base_model().state_dict()
        return {k.replace(".base_layer.", "."): v for k, v in base.items() if "lora_" not in k}

    def write(self, weights: Mapping[str, torch.Tensor]) -> int:
        """The adapter of ``weights`` (the policy's tensors by name) into its directory;
        the bytes written."""
        from peft import get_peft_model_state_dict

        adapter = get_peft_model_state_dict(self.module, state_dict=dict(weights))
        tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in adapter.items()}
        self.config.save_pretrained(str(self.directory))
        save_file(tensors, str(self.directory / "adapter_model.safetensors"))
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def load_body(self) -> dict[str, Any]:
        """The ``/v1/load_lora_adapter`` request that (re)loads the adapter in place."""
        path = str(self.directory.resolve())
        return {"lora_name": LORA_NAME, "lora_path": path, "load_inplace": True}


def _vllm_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds ``rank`` (it takes a fixed
    set of values)."""
    for allowed in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= allowed:
            return allowed
    raise ValueError(f"vLLM serves LoRA ranks up to 512, got model.lora_r={rank}")

"""What vLLM 0.32's CPU build cannot do for ardea, measured on it, in the words ardea's
errors use (the support matrix, docs/reference/models.md, lists them per family)."""

from __future__ import annotations

import torch

from ardea.model.moe import moe_routing

#: why an MoE model's sync probe fails: after ``reload_weights`` with changed expert
#: tensors, a Qwen3-MoE's greedy completion differs from transformers' with the same file,
#: while its first load matches transformers' log-probs exactly
MOE_RELOAD = (
    " (an MoE model: vLLM 0.32's CPU build reloads an MoE layer's expert weights wrongly in "
    "place, its completions then differ from transformers' with the same weights; generate "
    "with rollout.engine=in_process)"
)
#: why routing replay is refused here: vLLM 0.32 returns routed experts only from its V2 model
#: runner, which its CPU build cannot run without Triton's CPU backend (absent); its streamed
#: completions, which this engine reads, carry none on any device
NO_ROUTED_EXPERTS = (
    "the vllm engine cannot return routed experts (SamplingParams.routed_experts, "
    "algo.moe_routing_replay): vLLM 0.32 returns them only from its V2 model runner (not in "
    "its CPU build) and only in non-streamed completions; use rollout.engine=in_process"
)


def sync_hint(module: torch.nn.Module) -> str:
    """What to add to a failed sync probe's error for ``module``'s kind of model."""
    return MOE_RELOAD if moe_routing(module) is not None else ""

"""Mixture-of-experts terms shared by every strategy: load-balancing loss and router health.

When the policy is a Hugging Face MoE model (:func:`ardea.model.moe.moe_routing`), its
forward returns a load-balancing loss ``aux`` (the family's own, see
:func:`ardea.model.moe.load_balancing_loss`) and per-layer router logits. Every
strategy then adds ``algo.moe_aux_loss_coef * aux`` to its loss and logs:

- ``train/moe_aux_loss``: ``aux`` (1 for perfectly balanced routing);
- ``moe/router_entropy``: mean over tokens of the entropy of ``softmax(router logits)``;
- ``moe/dead_expert_fraction``: fraction of experts that received no top-k assignment;
- ``moe/load_imbalance_mean``: ``mean_e |c_e / c_ideal - 1|``;
- ``moe/load_imbalance_max``: ``max_e c_e / c_ideal``;

- ``moe/routing_replay_changed`` (``algo.moe_routing_replay``): the fraction of the
  replayed (token, layer) expert choices that the trainer's router would have made
  differently, the routing mismatch the replay removes;

where ``c_e`` is the number of top-k assignments of counted tokens to expert ``e`` and
``c_ideal = mean_e c_e = T K / E`` (``T`` tokens, ``K`` experts per token, ``E`` experts),
clamped to at least 1 as in seed 002 so that an empty batch gives finite values. Each router
metric is computed per MoE layer and averaged over layers (seed 002's definitions).
Deviation from seed 002: padding tokens (attention mask 0) are left out of the statistics.

Micro-batches: ``aux`` and the diagnostics are per-forward averages, so each micro-batch
contributes them weighted by its share of the step's routed tokens (``routed_tokens`` in
``step_counts``); summed over the micro-batches of a step, the loss term and the metrics are
token-weighted averages.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ardea.data import TrajectoryBatch
from ardea.model import entropy_from_logits
from ardea.model.moe import moe_routing

ROUTED_TOKENS = "routed_tokens"


def router_diagnostics(
    router_logits: Sequence[Tensor], top_k: int, token_mask: Tensor | None = None
) -> dict[str, float]:
    """Router health over the counted tokens, averaged over layers (module docstring).

    Args:
        router_logits: one ``(T, E)`` tensor of router logits per MoE layer.
        top_k: ``K``, experts each token is dispatched to.
        token_mask: ``(T,)`` bool or 0/1, 1 = the token counts (default: all).

    Returns:
        ``{"moe/router_entropy", "moe/dead_expert_fraction", "moe/load_imbalance_mean",
        "moe/load_imbalance_max"}``; empty when there is no layer.
    """
    per_layer: list[Tensor] = []
    for logits in router_logits:
        logits = logits.detach().float()  # (T, E)
        if token_mask is not None:
            logits = logits[token_mask.reshape(-1).bool()]
        experts = logits.shape[-1]
        entropy = entropy_from_logits(logits).mean() if logits.shape[0] else logits.new_zeros(())
        chosen = torch.topk(logits, min(top_k, experts), dim=-1).indices  # (T, K)
        counts = torch.bincount(chosen.reshape(-1), minlength=experts).float()  # (E,)
        load = counts / counts.mean().clamp(min=1.0)  # (E,) c_e / c_ideal
        per_layer.append(
            torch.stack(
                [entropy, (counts == 0).float().mean(), (load - 1.0).abs().mean(), load.max()]
            )
        )
    if not per_layer:
        return {}
    means = torch.stack(per_layer).mean(dim=0).tolist()
    names = ("router_entropy", "dead_expert_fraction", "load_imbalance_mean", "load_imbalance_max")
    return {f"moe/{name}": value for name, value in zip(names, means)}


def _routed(batch: TrajectoryBatch) -> float:
    """Tokens the router statistics count: attended tokens, or all of a packed batch."""
    mask = batch.model_inputs()["attention_mask"]
    return float(batch.input_ids.numel() if mask is None else mask.sum())


class MoETerms:
    """Adds ``coef * aux`` to a strategy's loss and logs the router diagnostics.

    Inactive (adds nothing, logs nothing) for a dense policy.
    """

    def __init__(self, policy: nn.Module, coef: float) -> None:
        routing = moe_routing(policy)
        self.top_k = routing[1] if routing is not None else 0
        self.coef = float(coef)

    @property
    def active(self) -> bool:
        return self.top_k > 0

    def step_counts(self, forwards: Sequence[TrajectoryBatch]) -> dict[str, float]:
        """``{"routed_tokens": ...}`` over the batches of the step's policy forwards; empty
        for a dense policy."""
        if not self.active:
            return {}
        return {ROUTED_TOKENS: sum(_routed(batch) for batch in forwards)}

    def add(
        self, loss: Tensor, output: object, batch: TrajectoryBatch, step_counts: dict[str, float]
    ) -> tuple[Tensor, dict[str, Tensor | float]]:
        """``(loss + coef * share * aux, metrics * share)``; ``share`` is this forward's
        fraction of the step's routed tokens. ``output`` is the policy's
        :class:`~ardea.model.LogprobOutput` (or ``LogitsOutput``) on ``batch``."""
        aux = getattr(output, "aux_loss", None)
        if aux is None or not self.active:
            return loss, {}
        attention_mask = batch.model_inputs()["attention_mask"]
        tokens = _routed(batch)
        share = tokens / max(step_counts.get(ROUTED_TOKENS, tokens), 1.0)
        mask = None if attention_mask is None else attention_mask.reshape(-1)
        metrics = {"train/moe_aux_loss": aux.detach() * share}
        for name, value in router_diagnostics(output.router_logits, self.top_k, mask).items():
            metrics[name] = value * share
        changed = getattr(output, "routing_changed", None)  # rows replaying their routing
        if changed is not None:
            metrics["moe/routing_replay_changed"] = changed.detach() * share
        return loss + (self.coef * share) * aux.to(loss.dtype), metrics

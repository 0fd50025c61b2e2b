"""Next-token log-probabilities and entropies of ``[N, S]`` sequences, computed in chunks.

Notation: ``N`` trajectories, ``S`` sequence length, ``H`` hidden size, ``V`` vocab, ``T``
the number of scored (flattened) token positions. For a causal LM with logits ``z`` and
temperature ``tau``:

    logprobs[n, t] = log softmax(z[n, t] / tau)[input_ids[n, t + 1]]
    entropy[n, t]  = -sum_v p_v log p_v,   p = softmax(z[n, t] / tau)

at every scored position: ``t < S - 1`` and, when an attention mask is given, both
``attention_mask[n, t]`` and ``attention_mask[n, t + 1]`` are 1. All other entries (the
last column, padding, the first real token after left padding) are exactly 0. Values
are float32 whatever the model dtype (computed in float32, or float64 for a float64 model).

Memory: the full-vocabulary float32 ``[N, S, V]`` tensor is never built. The backbone runs
once to produce ``(N, S, H)`` hidden states; the LM head and the float32 log-softmax then
run on ``chunk_size`` token positions at a time. With grad enabled each chunk is wrapped in
``torch.utils.checkpoint``, so backward keeps only the hidden states and recomputes one
chunk's logits at a time (peak extra memory ~ ``chunk_size x V`` floats).

Models whose logits are not ``lm_head(last_hidden_state)`` (see
:func:`ardea.model.backbone.split_causal_lm`, e.g. Gemma 2's soft-capping) take the full
forward instead: their ``[N, S, V]`` logits exist once in the model dtype, and only the
float32 log-softmax is chunked.

Distillation's forward KL needs more than the sampled token: ``top_logprobs=k`` also gives
each scored position's ``k`` most likely tokens (``top_ids``, ``top_logprobs``, ``(N, S, k)``,
in descending order) and ``logprobs_at=ids`` (``(N, S, k)`` long) the log-probs of the given
tokens (``logprobs_at``, ``(N, S, k)``, differentiable). Both are taken at the temperature
without top-k / top-p truncation: a token the truncation cuts would have log-prob -inf.

Mixture-of-experts models (:func:`ardea.model.moe.moe_routing`) also return their
router logits, one ``(N * S, E)`` tensor per MoE layer, and the family's load-balancing
loss over the attended tokens (``aux_loss``, differentiable in the router weights).
:func:`sequence_logits` is the full-vocabulary forward for losses that need every logit
(e.g. label-smoothed cross-entropy); it returns the same MoE outputs. Given
``routed_experts`` (``(N, S, L, K)``, the experts the rollout routed each token to), both
replay them (:mod:`ardea.model.routing_replay`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ardea.model.backbone import (
    backbone_forward,
    check_input_ids,
    resolve_position_ids,
    split_causal_lm,
)
from ardea.model.flops import count_forward, count_head
from ardea.model.moe import moe_forward_kwargs, moe_outputs
from ardea.model.routing_replay import replay_routing
from ardea.model.truncation import truncate


@dataclass(frozen=True)
class LogprobOutput:
    """Result of :func:`sequence_logprobs`.

    Attributes:
        logprobs: ``(N, S)`` float32 next-token log-probs (see module docstring).
        entropy: ``(N, S)`` float32 next-token entropies, or ``None`` unless requested.
        aux_loss: a mixture-of-experts model's load-balancing loss (0-d), else ``None``.
        router_logits: an MoE model's router logits, one ``(N * S, E)`` tensor per MoE
            layer (rows in ``input_ids`` order, padding included), else ``None``.
        top_ids, top_logprobs: ``(N, S, k)`` the ``top_logprobs=k`` most likely next tokens
            and their log-probs (untruncated), else ``None``.
        logprobs_at: ``(N, S, k)`` float32 log-probs (untruncated) of the ``logprobs_at``
            ids, else ``None``.
        routing_changed: with ``routed_experts``, the fraction of replayed (token, MoE
            layer) expert choices the model's own router would have made differently (0-d),
            else ``None``.
    """

    logprobs: Tensor
    entropy: Tensor | None = None
    aux_loss: Tensor | None = None
    router_logits: tuple[Tensor, ...] | None = None
    top_ids: Tensor | None = None
    top_logprobs: Tensor | None = None
    logprobs_at: Tensor | None = None
    routing_changed: Tensor | None = None


@dataclass(frozen=True)
class LogitsOutput:
    """Result of :func:`sequence_logits`: ``logits (N, S, V)`` in the model dtype
    (``logits[:, t]`` predicts token ``t + 1``) and the MoE outputs of :class:`LogprobOutput`."""

    logits: Tensor
    aux_loss: Tensor | None = None
    router_logits: tuple[Tensor, ...] | None = None
    routing_changed: Tensor | None = None


def _at_least_float32(logits: Tensor) -> Tensor:
    """bf16/fp16 -> float32; float32 and float64 are kept."""
    return logits if logits.dtype in (torch.float32, torch.float64) else logits.float()


def scale_logits(logits: Tensor, temperature: float) -> Tensor:
    """``z = logits / T`` in at least float32: the logits of the distribution sampled at
    temperature ``T > 0``. The trainer's log-probs and the engine's behaviour log-probs both
    come from here, so the PPO ratio compares the same distributions."""
    z = _at_least_float32(logits)
    return z if temperature == 1.0 else z / temperature


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """Log-probability of each label: ``z[..., y] - logsumexp(z)``.

    Args:
        logits: ``(..., V)`` any float dtype; computed in float32 (float64 kept).
        labels: ``(...)`` int64 ids in ``[0, V)``.

    Returns:
        ``(...)`` log-probs (float32, or float64 for float64 logits); only ``(...)``
        reductions are formed, never a full ``(..., V)`` log-softmax.
    """
    logits = _at_least_float32(logits)
    picked = logits.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of ``softmax(z)``: ``H = -sum_v p_v log p_v = logsumexp(z) - sum_v p_v z_v``.

    Args:
        logits: ``(..., V)`` finite logits, any float dtype (computed in float32, float64
            kept).

    Returns:
        ``(...)`` entropies in nats (float32, or float64 for float64 logits).
    """
    logits = _at_least_float32(logits)
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def _chunk_scores(
    to_logits: Callable[[Tensor], Tensor],
    temperature: float,
    with_entropy: bool,
    truncation: tuple[int, float] = (0, 1.0),
    top: int = 0,
) -> Callable[[Tensor, Tensor, Tensor], tuple[Tensor, ...]]:
    """Per-chunk function ``(x (T, H or V), labels (T,), ids (T, k) or empty) ->
    (logprobs (T,), entropy (T,), top log-probs (T, top), top ids (T, top), log-probs at
    ids (T, k))``; what was not requested is an empty tensor (checkpoint needs tensor
    outputs). The entropy, the top tokens and the log-probs at ids are those of the
    untruncated distribution."""

    def score(x: Tensor, labels: Tensor, ids: Tensor) -> tuple[Tensor, ...]:
        logits = scale_logits(to_logits(x), temperature)  # (T, V), one chunk only
        logprobs = logprobs_from_logits(truncated(logits, labels, *truncation), labels).float()
        entropy = entropy_from_logits(logits).float() if with_entropy else x.new_empty(0)
        empty = x.new_empty(0)
        top_values, top_ids, at_ids = empty, empty.long(), empty
        if top or ids.numel():
            full = (logits - torch.logsumexp(logits, dim=-1, keepdim=True)).float()  # (T, V)
            if top:
                top_values, top_ids = full.topk(top, dim=-1)
            if ids.numel():
                at_ids = full.gather(-1, ids.long())
        return logprobs, entropy, top_values, top_ids, at_ids

    return score


def truncated(z: Tensor, labels: Tensor, top_k: int, top_p: float) -> Tensor:
    """``z (T, V)`` restricted to its top-k / top-p set (:mod:`ardea.model.truncation`) as
    the engine sampled from it, the label always kept: rounding may leave a sampled token
    just outside the trainer's own set, and its log-prob must stay finite."""
    if top_k == 0 and top_p >= 1.0:
        return z
    index = labels.long().unsqueeze(-1)
    return truncate(z, top_k, top_p).scatter(-1, index, z.gather(-1, index))


def _scored_positions(input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
    """``(N, S - 1)`` bool: position ``t`` is scored iff its token and the next are real.
    :func:`sequence_logprobs` finds their indices once (``nonzero``: its one host sync, the
    count being data-dependent) and indexes with them."""
    scored = torch.ones_like(input_ids[:, 1:], dtype=torch.bool)
    if attention_mask is not None:
        real = attention_mask.bool()
        scored = real[:, :-1] & real[:, 1:]
    return scored


def _run_chunks(
    score: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, ...]],
    inputs: Tensor,
    labels: Tensor,
    ids: Tensor,
    chunk_size: int,
) -> list[Tensor]:
    """Apply ``score`` to ``chunk_size`` rows of ``inputs (T, D)`` / ``labels (T,)`` /
    ``ids (T, k)`` (or an empty ``ids``) at a time, checkpointed when grad is on; returns
    each of its outputs concatenated over the chunks."""
    use_checkpoint = torch.is_grad_enabled() and inputs.requires_grad
    parts: list[tuple[Tensor, ...]] = []
    for start in range(0, inputs.shape[0], chunk_size):
        x = inputs[start : start + chunk_size]
        y = labels[start : start + chunk_size]
        at = ids[start : start + chunk_size] if ids.numel() else ids
        if use_checkpoint:
            parts.append(checkpoint(score, x, y, at, use_reentrant=False))
        else:
            parts.append(score(x, y, at))
    if not parts:
        return [inputs.new_zeros(0, dtype=torch.float32)] * 5
    return [torch.cat(column) for column in zip(*parts)]


def _scatter(values: Tensor, where: tuple[Tensor, Tensor], shape: torch.Size) -> Tensor:
    """Place ``values (T, ...)`` at the scored positions ``where`` (row and column indices)
    of an ``(N, S)`` grid ``shape``; return ``(N, S, ...)`` with zeros elsewhere, including
    the last column."""
    out = values.new_zeros(*shape, *values.shape[1:])  # (T, k) values: (N, S, k)
    return out.index_put(where, values)  # differentiable


def sequence_logits(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    position_ids: Tensor | None = None,
    routed_experts: Tensor | None = None,
) -> LogitsOutput:
    """Full-vocabulary logits of ``input_ids`` (one ``(N, S, V)`` tensor in the model dtype).

    Prefer :func:`sequence_logprobs` when only the sampled tokens' log-probs are needed.
    Arguments as in :func:`sequence_logprobs`; MoE models also give ``aux_loss`` and
    ``router_logits``.
    """
    check_input_ids(input_ids, "logits")
    count_forward(model, input_ids, attention_mask)
    with _replaying(model, routed_experts) as replay:
        outputs = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=resolve_position_ids(attention_mask, position_ids),
            use_cache=False,
            **moe_forward_kwargs(model),
        )
    aux_loss, router = moe_outputs(model, outputs, attention_mask)
    return LogitsOutput(
        logits=outputs.logits,
        aux_loss=aux_loss,
        router_logits=router,
        routing_changed=replay.changed_fraction() if replay is not None else None,
    )


def _replaying(model: nn.Module, routed_experts: Tensor | None):
    """The replay of ``routed_experts`` (its record) around a forward, or nothing."""
    if routed_experts is None:
        return contextlib.nullcontext()
    return replay_routing(model, routed_experts)


def _check_options(
    temperature: float, top_k: int, top_p: float, chunk_size: int, top_logprobs: int = 0
) -> None:
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if top_k < 0 or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_k must be >= 0 and top_p in (0, 1], got {top_k}, {top_p}")
    if top_logprobs < 0:
        raise ValueError(f"top_logprobs must be >= 0, got {top_logprobs}")


def sequence_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    position_ids: Tensor | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    top_logprobs: int = 0,
    logprobs_at: Tensor | None = None,
    routed_experts: Tensor | None = None,
) -> LogprobOutput:
    """Next-token log-probs (and optionally entropies) of ``input_ids`` under ``model``.

    Args:
        model: any HF causal LM.
        input_ids: ``(N, S)`` token ids.
        attention_mask: ``(N, S)``, 1 = real token; ``None`` means all real.
        position_ids: ``(N, S)``; when ``None`` and a mask is given, positions count real
            tokens (``cumsum(mask) - 1``) so left padding does not shift them. Packed rows
            pass positions restarting at 0 per document and no mask: transformers then
            attends within each document (the loss mask drops each document's first entry).
        temperature: logits are divided by it before the softmax (sampling temperature).
        top_k: the top-k the tokens were sampled under (0 = none); see ``top_p``.
        top_p: the top-p they were sampled under (1 = none): log-probs are those of the
            top-k / top-p set renormalised (:func:`truncated`).
        chunk_size: token positions per LM-head/log-softmax chunk.
        with_entropy: also return ``entropy``.
        top_logprobs: also return the ``top_logprobs`` most likely next tokens (0 = not).
        logprobs_at: ``(N, S, k)`` token ids: also return their log-probs.
        routed_experts: ``(N, S, L, K)`` expert ids to replay (-1: own; module docstring).

    Returns:
        :class:`LogprobOutput` with ``logprobs (N, S)`` float32 — ``logprobs[:, t]`` scores
        token ``t + 1`` — and what was asked for, zeros where not scored (and MoE outputs).
    """
    check_input_ids(input_ids, "log-prob")
    _check_options(temperature, top_k, top_p, chunk_size, top_logprobs)
    scored = _scored_positions(input_ids, attention_mask).nonzero(as_tuple=True)  # 1 sync
    labels = input_ids[:, 1:][scored]  # (T,)
    at = _ids_at(logprobs_at, input_ids)[:, :-1][scored] if logprobs_at is not None else None
    inputs, to_logits, moe = _head_inputs(
        model, input_ids, attention_mask, position_ids, scored, routed_experts
    )
    score = _chunk_scores(to_logits, temperature, with_entropy, (top_k, top_p), top_logprobs)
    ids = at if at is not None else labels.new_empty(0)
    logprobs, entropy, top_values, top_ids, at_values = _run_chunks(
        score, inputs, labels, ids, chunk_size
    )
    return LogprobOutput(
        logprobs=_scatter(logprobs, scored, input_ids.shape),
        entropy=_scatter(entropy, scored, input_ids.shape) if with_entropy else None,
        top_ids=_scatter(top_ids, scored, input_ids.shape) if top_logprobs else None,
        top_logprobs=_scatter(top_values, scored, input_ids.shape) if top_logprobs else None,
        logprobs_at=_scatter(at_values, scored, input_ids.shape) if at is not None else None,
        **moe,
    )


def _head_inputs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    position_ids: Tensor | None,
    scored: tuple[Tensor, Tensor],
    routed_experts: Tensor | None,
) -> tuple[Tensor, Callable[[Tensor], Tensor], dict[str, object]]:
    """The scored positions' ``(T, H)`` hidden states and the LM head (or, for a model whose
    logits are not the head's, their ``(T, V)`` logits and the identity), with the MoE
    outputs (module docstring: ``aux_loss``, ``router_logits``, ``routing_changed``)."""
    parts = split_causal_lm(model)
    if parts is None:
        full = sequence_logits(
            model, input_ids, attention_mask, position_ids=position_ids,
            routed_experts=routed_experts,
        )  # fmt: skip
        moe = dict(aux_loss=full.aux_loss, router_logits=full.router_logits,
                   routing_changed=full.routing_changed)  # fmt: skip
        return full.logits[:, :-1][scored], nn.Identity(), moe
    backbone, head = parts
    with _replaying(model, routed_experts) as replay:
        outputs = backbone_forward(
            backbone, input_ids, attention_mask, position_ids, **moe_forward_kwargs(model)
        )
    aux_loss, router = moe_outputs(model, outputs, attention_mask)
    inputs = outputs.last_hidden_state[:, :-1][scored]  # (T, H)
    count_head(head, inputs)
    changed = replay.changed_fraction() if replay is not None else None
    return inputs, head, dict(aux_loss=aux_loss, router_logits=router, routing_changed=changed)


def _ids_at(ids: Tensor, input_ids: Tensor) -> Tensor:
    """``ids`` checked as ``(N, S, k)`` integer token ids matching ``input_ids (N, S)``."""
    if ids.dim() != 3 or ids.shape[:2] != input_ids.shape or ids.dtype.is_floating_point:
        raise ValueError(
            f"logprobs_at must be (N, S, k) integer ids with (N, S) = {tuple(input_ids.shape)}, "
            f"got {tuple(ids.shape)} {ids.dtype}"
        )
    return ids

"""Clipped policy-gradient losses: PPO (clip-higher, dual-clip), decoupled PPO and GSPO.

Each is an entry of :data:`ardea.algo.POLICY_LOSSES` reading one
:class:`~ardea.algo.PolicyLossInputs` of next-token-aligned ``(N, S)`` tensors: ``logprobs``
of the policy being trained (with gradient), the ratio's reference ``old_logprobs``
(detached), ``advantages`` and ``loss_mask``. With ``r = exp(logprobs - old_logprobs)``
(log-ratio clamped to [-20, 20] so that ``exp`` cannot overflow) and ``A`` the advantage,
the per-token loss is::

    l = max(-A * r, -A * clip(r, 1 - eps_clip, 1 + eps_clip_higher))          (PPO)
    l = min(l, -A * c_clip)   where A < 0                                     (dual-clip)

References: Schulman et al. 2017 (PPO, eq. 7); Yu et al. 2025 (DAPO, clip-higher:
``eps_clip_higher`` > ``eps_clip``); Ye et al. 2020 (dual-clip PPO, ``c_clip`` > 1);
Hilton et al. 2022 ("Batch size-invariance for policy optimization", decoupled PPO: the
ratio is taken against a proximal policy and each token is weighted by the behaviour
importance weight ``pi_prox / pi_behav``); Zheng et al. 2025 (GSPO, sequence-level ratio,
in its GSPO-token form as the Tinker API documents it).

The Tinker API server serves ``ppo`` and ``gspo`` too: its ``clip_low_threshold`` ``lo``
and ``clip_high_threshold`` ``hi`` are ``eps_clip = 1 - lo`` and ``eps_clip_higher = hi - 1``
and its loss is the plain token sum (:mod:`ardea.service.tinker_losses`).

Every loss returns ``(loss, metrics)``: ``loss`` is a 0-d tensor aggregated by
:func:`ardea.algo.agg_loss` as ``inputs.agg`` says; metrics are detached 0-d tensors under
``loss/`` and are token means over ``inputs.agg.tokens`` like ``token-mean``, so that
summing them over micro-batches gives the whole-batch value:

- ``loss/policy``: the aggregated loss;
- ``loss/clip_frac``: fraction of tokens where the clipped term is the active one;
- ``loss/dual_clip_frac``: fraction of tokens where dual-clip bounds the loss;
- ``loss/approx_kl``: ``mean(r - 1 - log r)``, Schulman's k3 estimate of KL(pi_old || pi);
- ``loss/behav_imp_weight``, ``loss/behav_drop_frac`` (decoupled PPO): mean importance
  weight over all counted tokens (a dropped token counts as 0), fraction of tokens dropped
  by ``behav_imp_weight_cap``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ardea.algo._checks import as_mask, check_finite, check_float, check_shape
from ardea.algo.agg import agg_loss, masked_mean
from ardea.algo.policy_loss_registry import Metrics, PolicyLossInputs, register_policy_loss

LOG_RATIO_CLAMP = 20.0
CLIP = ("eps_clip", "eps_clip_higher")


def check_inputs(inputs: PolicyLossInputs, *names: str) -> Tensor:
    """Check the ``(N, S)`` float tensors ``logprobs`` and ``names`` of ``inputs`` (one
    shape, finite where counted); return ``loss_mask`` as bool."""
    first = inputs.logprobs
    tensors = {"logprobs": first, **{name: getattr(inputs, name) for name in names}}
    for name, x in tensors.items():
        check_float(name, x)
        check_shape(name, x, first.shape, "(N, S)")
    if first.dim() != 2:
        raise ValueError(f"logprobs must have shape (N, S), got {tuple(first.shape)}")
    m = as_mask("loss_mask", inputs.loss_mask, first.shape, "(N, S)")
    for name, x in tensors.items():
        check_finite(name, x.detach(), where=m)
    return m


def _check_eps(eps_clip: float, eps_clip_higher: float | None, c_clip: float | None):
    high = eps_clip if eps_clip_higher is None else eps_clip_higher
    if not (math.isfinite(eps_clip) and 0 < eps_clip < 1):
        raise ValueError(f"eps_clip must lie in (0, 1), got {eps_clip}")
    if not (math.isfinite(high) and high > 0):
        raise ValueError(f"eps_clip_higher must be a positive number, got {eps_clip_higher}")
    if c_clip is not None and not (math.isfinite(c_clip) and c_clip > 1):
        raise ValueError(f"c_clip must be a number > 1 (dual-clip), got {c_clip}")
    return eps_clip, high


def clipped_surrogate(
    log_ratio: Tensor,
    advantages: Tensor,
    *,
    eps_clip: float,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token PPO loss from the log-ratio; returns ``(loss, clipped, dual_clipped)``.

    ``loss = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``, then
    ``min(loss, -A c_clip)`` where ``A < 0`` when ``c_clip`` is set; all ``(N, S)``; the
    two flags are bool tensors marking where each clip is the active term.
    """
    low, high = _check_eps(eps_clip, eps_clip_higher, c_clip)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    loss = torch.maximum(unclipped, clipped)
    clip_active = clipped > unclipped
    dual_active = torch.zeros_like(clip_active)
    if c_clip is not None:
        bound = -advantages * c_clip
        dual_active = (advantages < 0) & (loss > bound)
        loss = torch.where(dual_active, bound, loss)
    return loss, clip_active, dual_active


def approx_kl(log_ratio: Tensor) -> Tensor:
    """``r - 1 - log r`` per token (k3), detached, from the log-ratio (clamped like ``r``)."""
    lr = log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(lr) - 1.0 - lr


def _clipped(
    inputs: PolicyLossInputs, m: Tensor, old: Tensor, weight: Tensor | None, clip: dict
) -> tuple[Tensor, Metrics]:
    """Shared body of PPO and decoupled PPO: clipped surrogate, optional weight, metrics."""
    log_ratio = inputs.logprobs - old.detach()
    per_token, clip_active, dual_active = clipped_surrogate(
        log_ratio, inputs.advantages.detach(), **clip
    )
    if weight is not None:
        per_token = per_token * weight
    loss = agg_loss(per_token, m, inputs.agg)

    def mean(x: Tensor) -> Tensor:
        return masked_mean(x.to(inputs.logprobs.dtype), m, inputs.agg.tokens)

    return loss, {
        "loss/policy": loss.detach(),
        "loss/clip_frac": mean(clip_active),
        "loss/dual_clip_frac": mean(dual_active),
        "loss/approx_kl": mean(approx_kl(log_ratio)),
    }


@register_policy_loss("ppo", options=(*CLIP, "c_clip"))
def ppo(
    inputs: PolicyLossInputs,
    *,
    eps_clip: float = 0.2,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
) -> tuple[Tensor, Metrics]:
    """PPO clipped surrogate with clip-higher and dual-clip (module docstring formula).

    Args:
        inputs: ``logprobs``, ``old_logprobs``, ``advantages``, ``loss_mask``: ``(N, S)``.
        eps_clip: the ratio clip range is ``[1 - eps_clip, 1 + eps_clip_higher]``.
        eps_clip_higher: its upper side (``None`` means symmetric: ``eps_clip``).
        c_clip: dual-clip constant > 1, or None.

    Returns:
        ``(loss, metrics)``.
    """
    m = check_inputs(inputs, "old_logprobs", "advantages")
    clip = dict(eps_clip=eps_clip, eps_clip_higher=eps_clip_higher, c_clip=c_clip)
    return _clipped(inputs, m, inputs.old_logprobs, None, clip)


@register_policy_loss(
    "decoupled_ppo", options=(*CLIP, "c_clip", "behav_imp_weight_cap"), needs_proximal=True
)
def decoupled_ppo(
    inputs: PolicyLossInputs,
    *,
    eps_clip: float = 0.2,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    behav_imp_weight_cap: float | None = None,
) -> tuple[Tensor, Metrics]:
    """Decoupled PPO for off-policy (stale) data.

    ``l = w * PPO(r)`` with ``r = pi / pi_prox`` (``old_logprobs``: the proximal policy)
    clipped as in :func:`ppo` and the behaviour importance weight ``w = pi_prox / pi_behav``
    (``behav_logprobs``, the policy that generated the tokens; constant). Tokens with
    ``w > behav_imp_weight_cap`` (>= 1, or None) get ``w = 0`` (dropped) but stay in the
    normalizing count. The other options are :func:`ppo`'s.

    Returns:
        ``(loss, metrics)``, with ``loss/behav_imp_weight`` and ``loss/behav_drop_frac``.
    """
    if inputs.behav_logprobs is None:
        raise ValueError("policy loss 'decoupled_ppo' needs behav_logprobs (N, S)")
    m = check_inputs(inputs, "old_logprobs", "behav_logprobs", "advantages")
    if behav_imp_weight_cap is not None and not behav_imp_weight_cap >= 1:
        raise ValueError(f"behav_imp_weight_cap must be >= 1, got {behav_imp_weight_cap}")
    log_w = (inputs.old_logprobs - inputs.behav_logprobs).detach()
    weight = torch.exp(log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (N, S) pi_prox / pi_behav
    kept = torch.ones_like(m) if behav_imp_weight_cap is None else weight <= behav_imp_weight_cap
    weight = torch.where(kept, weight, 0.0)
    clip = dict(eps_clip=eps_clip, eps_clip_higher=eps_clip_higher, c_clip=c_clip)
    loss, metrics = _clipped(inputs, m, inputs.old_logprobs, weight, clip)
    tokens = inputs.agg.tokens
    metrics["loss/behav_imp_weight"] = masked_mean(weight, m, tokens)
    metrics["loss/behav_drop_frac"] = masked_mean((~kept).to(weight.dtype), m, tokens)
    return loss, metrics


@register_policy_loss("gspo", options=CLIP)
def gspo(
    inputs: PolicyLossInputs, *, eps_clip: float = 3e-4, eps_clip_higher: float | None = 4e-4
) -> tuple[Tensor, Metrics]:
    """GSPO: PPO clipping on the length-normalized sequence ratio (GSPO-token form).

    With ``M`` the ``ratio_mask`` (default ``loss_mask``): ``log s_i = sum_t M (logprobs -
    old_logprobs) / sum_t M`` (N,), the mean token log-ratio of row ``i``; each token uses
    ``s_{i,t} = sg(s_i) * pi_t / sg(pi_t)`` (value ``s_i``, gradient through its own token)
    in ``max(-A s, -A clip(s, 1 - eps_clip, 1 + eps_clip_higher))``. Defaults are the
    paper's (eps 3e-4 / 4e-4). This is the Tinker API's ``gspo`` (tinker-docs.
    thinkingmachines.ai/tinker/losses/gspo: the sequence ratio over ``sequence_ratio_mask``,
    every token's ratio with the sequence ratio's value and its own gradient), whose
    ``clip(s, 1 - eps_low, 1 + eps_high)`` is this one with its thresholds as above. A row
    whose ratio mask marks no token takes ``s = 1``.

    Returns:
        ``(loss, metrics)``.
    """
    m = check_inputs(inputs, "old_logprobs", "advantages")
    in_ratio = (
        m
        if inputs.ratio_mask is None
        else as_mask("ratio_mask", inputs.ratio_mask, m.shape, "(N, S)")
    )
    logprobs = inputs.logprobs
    token_log_ratio = torch.where(in_ratio, logprobs - inputs.old_logprobs.detach(), 0.0)
    lengths = in_ratio.sum(dim=-1).clamp(min=1).to(logprobs.dtype)
    seq_log_ratio = (token_log_ratio.sum(dim=-1) / lengths).detach()  # (N,)
    log_s = logprobs - logprobs.detach() + seq_log_ratio[:, None]  # (N, S)
    per_token, clip_active, _ = clipped_surrogate(
        log_s, inputs.advantages.detach(), eps_clip=eps_clip, eps_clip_higher=eps_clip_higher
    )
    loss = agg_loss(per_token, m, inputs.agg)
    tokens = inputs.agg.tokens
    return loss, {
        "loss/policy": loss.detach(),
        "loss/clip_frac": masked_mean(clip_active.to(logprobs.dtype), m, tokens),
        "loss/approx_kl": masked_mean(approx_kl(token_log_ratio), m, tokens),
    }

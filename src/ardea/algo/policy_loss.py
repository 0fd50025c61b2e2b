"""Policy-gradient losses: PPO (clip-higher, dual-clip), decoupled PPO and GSPO.

All inputs are next-token-aligned ``(N, S)`` tensors: ``logprobs`` of the policy being
trained (with gradient), the reference log-probs of the ratio (detached), ``advantages``
and ``loss_mask``. With ``r = exp(logprobs - old_logprobs)`` (log-ratio clamped to
[-20, 20] so that ``exp`` cannot overflow) and ``A`` the advantage, the per-token loss is::

    l = max(-A * r, -A * clip(r, 1 - eps_clip, 1 + eps_clip_higher))          (PPO)
    l = min(l, -A * c_clip)   where A < 0                                     (dual-clip)

References: Schulman et al. 2017 (PPO, eq. 7); Yu et al. 2025 (DAPO, clip-higher:
``eps_clip_higher`` > ``eps_clip``); Ye et al. 2020 (dual-clip PPO, ``c_clip`` > 1);
Hilton et al. 2022 ("Batch size-invariance for policy optimization", decoupled PPO: the
ratio is taken against a proximal policy and each token is weighted by the behaviour
importance weight ``pi_prox / pi_behav``); Zheng et al. 2025 (GSPO, sequence-level ratio).

Every loss returns ``(loss, metrics)``: ``loss`` is a 0-d tensor aggregated by
:func:`ardea.algo.agg.agg_loss`; metrics are detached 0-d tensors under ``loss/`` and are
token means over ``global_tokens`` like ``token-mean``, so that summing them over
micro-batches gives the whole-batch value:

- ``loss/policy``: the aggregated loss;
- ``loss/clip_frac``: fraction of tokens where the clipped term is the active one;
- ``loss/dual_clip_frac``: fraction of tokens where dual-clip bounds the loss;
- ``loss/approx_kl``: ``mean(r - 1 - log r)``, Schulman's k3 estimate of KL(pi_old || pi);
- ``loss/behav_imp_weight``, ``loss/behav_drop_frac`` (decoupled PPO): mean importance
  weight over all counted tokens (a dropped token counts as 0), fraction of tokens dropped
  by ``behav_imp_weight_cap``.

The registry of these losses, one signature for all: :mod:`ardea.algo.policy_loss_registry`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ardea.algo._checks import as_mask, check_finite, check_float, check_shape
from ardea.algo.agg import agg_loss, masked_mean

LOG_RATIO_CLAMP = 20.0
Metrics = dict[str, Tensor]


def _check_inputs(mask: Tensor, **tensors: Tensor) -> Tensor:
    first = next(iter(tensors.values()))
    for name, x in tensors.items():
        check_float(name, x)
        check_shape(name, x, first.shape, "(N, S)")
    if first.dim() != 2:
        raise ValueError(f"logprobs must have shape (N, S), got {tuple(first.shape)}")
    m = as_mask("loss_mask", mask, first.shape, "(N, S)")
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


def _approx_kl(log_ratio: Tensor) -> Tensor:
    lr = log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(lr) - 1.0 - lr


def _ppo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    weight: Tensor | None,
    clip: dict,
    agg: dict,
) -> tuple[Tensor, Metrics]:
    """Shared body of PPO and decoupled PPO: clipped surrogate, optional weight, metrics."""
    log_ratio = logprobs - old_logprobs.detach()
    per_token, clip_active, dual_active = clipped_surrogate(log_ratio, advantages.detach(), **clip)
    if weight is not None:
        per_token = per_token * weight
    loss = agg_loss(per_token, mask, **agg)

    def mean(x: Tensor) -> Tensor:
        return masked_mean(x.to(logprobs.dtype), mask, global_tokens=agg["global_tokens"])

    return loss, {
        "loss/policy": loss.detach(),
        "loss/clip_frac": mean(clip_active),
        "loss/dual_clip_frac": mean(dual_active),
        "loss/approx_kl": mean(_approx_kl(log_ratio)),
    }


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    loss_agg_mode: str = "token-mean",
    global_tokens: int | Tensor | None = None,
    global_seqs: int | Tensor | None = None,
    horizon: int | None = None,
) -> tuple[Tensor, Metrics]:
    """PPO clipped surrogate with clip-higher and dual-clip (module docstring formula).

    Args:
        logprobs: ``(N, S)`` log-probs of the trained policy (with gradient).
        old_logprobs: ``(N, S)`` log-probs of the policy that produced the data.
        advantages: ``(N, S)``.
        loss_mask: ``(N, S)`` bool or 0/1.
        eps_clip: the ratio clip range is ``[1 - eps_clip, 1 + eps_clip_higher]``.
        eps_clip_higher: its upper side (``None`` means symmetric: ``eps_clip``).
        c_clip: dual-clip constant > 1, or None.
        loss_agg_mode: the aggregation (``mode`` of :func:`agg_loss`).
        global_tokens: see :func:`agg_loss`.
        global_seqs: see :func:`agg_loss`.
        horizon: see :func:`agg_loss`.

    Returns:
        ``(loss, metrics)``.
    """
    m = _check_inputs(
        loss_mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages
    )
    clip = dict(eps_clip=eps_clip, eps_clip_higher=eps_clip_higher, c_clip=c_clip)
    agg = dict(
        mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, horizon=horizon
    )
    return _ppo(logprobs, old_logprobs, advantages, m, None, clip, agg)


def decoupled_ppo_policy_loss(
    logprobs: Tensor,
    prox_logprobs: Tensor,
    behav_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    behav_imp_weight_cap: float | None = None,
    loss_agg_mode: str = "token-mean",
    global_tokens: int | Tensor | None = None,
    global_seqs: int | Tensor | None = None,
    horizon: int | None = None,
) -> tuple[Tensor, Metrics]:
    """Decoupled PPO for off-policy (stale) data.

    ``l = w * PPO(r)`` with ``r = pi / pi_prox`` clipped as in :func:`ppo_policy_loss` and
    the behaviour importance weight ``w = pi_prox / pi_behav`` (constant). Tokens with
    ``w > behav_imp_weight_cap`` get ``w = 0`` (dropped) but stay in the normalizing count.

    Args:
        logprobs: ``(N, S)`` trained policy (with gradient).
        prox_logprobs: ``(N, S)`` proximal policy, recomputed by the trainer before the update.
        behav_logprobs: ``(N, S)`` behaviour policy that generated the tokens (rollout).
        advantages: ``(N, S)``.
        loss_mask: ``(N, S)`` bool or 0/1.
        behav_imp_weight_cap: cap >= 1 on ``w``, or None.

    The other arguments are those of :func:`ppo_policy_loss`.

    Returns:
        ``(loss, metrics)``, with ``loss/behav_imp_weight`` and ``loss/behav_drop_frac``.
    """
    m = _check_inputs(
        loss_mask,
        logprobs=logprobs,
        prox_logprobs=prox_logprobs,
        behav_logprobs=behav_logprobs,
        advantages=advantages,
    )
    if behav_imp_weight_cap is not None and not behav_imp_weight_cap >= 1:
        raise ValueError(f"behav_imp_weight_cap must be >= 1, got {behav_imp_weight_cap}")
    log_w = (prox_logprobs - behav_logprobs).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    weight = torch.exp(log_w)  # (N, S) pi_prox / pi_behav
    kept = torch.ones_like(m) if behav_imp_weight_cap is None else weight <= behav_imp_weight_cap
    weight = torch.where(kept, weight, 0.0)
    clip = dict(eps_clip=eps_clip, eps_clip_higher=eps_clip_higher, c_clip=c_clip)
    agg = dict(
        mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, horizon=horizon
    )
    loss, metrics = _ppo(logprobs, prox_logprobs, advantages, m, weight, clip, agg)
    metrics["loss/behav_imp_weight"] = masked_mean(weight, m, global_tokens=global_tokens)
    metrics["loss/behav_drop_frac"] = masked_mean(
        (~kept).to(logprobs.dtype), m, global_tokens=global_tokens
    )
    return loss, metrics


def gspo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_clip: float = 3e-4,
    eps_clip_higher: float | None = 4e-4,
    loss_agg_mode: str = "seq-mean-token-mean",
    global_tokens: int | Tensor | None = None,
    global_seqs: int | Tensor | None = None,
    horizon: int | None = None,
) -> tuple[Tensor, Metrics]:
    """GSPO: PPO clipping on the length-normalized sequence ratio (GSPO-token form).

    ``log s_i = sum_t m (logprobs - old_logprobs) / |y_i|`` (N,); each token uses
    ``s_{i,t} = sg(s_i) * pi_t / sg(pi_t)`` (value ``s_i``, gradient through its own token)
    in ``max(-A s, -A clip(s, 1 - eps_clip, 1 + eps_clip_higher))``. Defaults are the
    paper's (eps 3e-4 / 4e-4, sequence-mean of token means).

    Returns:
        ``(loss, metrics)``.
    """
    m = _check_inputs(
        loss_mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages
    )
    token_log_ratio = torch.where(m, logprobs - old_logprobs.detach(), 0.0)  # (N, S)
    lengths = m.sum(dim=-1).clamp(min=1).to(logprobs.dtype)
    seq_log_ratio = (token_log_ratio.sum(dim=-1) / lengths).detach()  # (N,)
    log_s = logprobs - logprobs.detach() + seq_log_ratio[:, None]  # (N, S)
    per_token, clip_active, _ = clipped_surrogate(
        log_s, advantages.detach(), eps_clip=eps_clip, eps_clip_higher=eps_clip_higher
    )
    loss = agg_loss(
        per_token,
        m,
        loss_agg_mode,
        global_tokens=global_tokens,
        global_seqs=global_seqs,
        horizon=horizon,
    )
    metrics = {
        "loss/policy": loss.detach(),
        "loss/clip_frac": masked_mean(
            clip_active.to(logprobs.dtype), m, global_tokens=global_tokens
        ),
        "loss/approx_kl": masked_mean(_approx_kl(token_log_ratio), m, global_tokens=global_tokens),
    }
    return loss, metrics

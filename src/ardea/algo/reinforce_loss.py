"""REINFORCE-family policy losses: weighted cross-entropy, importance sampling, CISPO, DRO.

Entries of :data:`ardea.algo.POLICY_LOSSES` as the Tinker API defines its built-in losses of
the same names (tinker-docs.thinkingmachines.ai/tinker/losses, one page per loss; the
Tinker API server serves them, :mod:`ardea.service.tinker_losses`). On next-token-aligned
``(N, S)`` tensors, with ``q`` the ``old_logprobs`` (the sampler's), ``A`` the
``advantages``, ``r = exp(logprobs - q)`` and ``sg`` the stop-gradient, the per-token loss
is::

    l = -A * logprobs                                            (cross_entropy)
    l = -r * A                                                   (importance_sampling)
    l = -sg(clip(r, 1 - eps_clip, 1 + eps_clip_higher)) * logprobs * A          (cispo)
    l = -(logprobs * A - beta / 2 * (logprobs - q)^2)                             (dro)

aggregated by :func:`ardea.algo.agg_loss` as ``inputs.agg`` says (the Tinker API: the plain
sum over tokens). ``cross_entropy``'s ``A`` is the per-token weight of the token's
negative log-likelihood (the Tinker API's ``weights``; a custom loss's ``-dL/dlogprobs``),
which makes it REINFORCE's surrogate: it reads no ``old_logprobs``. The Tinker API's CISPO
thresholds ``lo``, ``hi`` are ``eps_clip = 1 - lo``, ``eps_clip_higher = hi - 1``.

References: Williams 1992 (REINFORCE); MiniMax 2025 (MiniMax-M1, CISPO: the clipped ratio is
a constant weight, so no token's gradient is zeroed by the clip); DRO as the Tinker API
defines it (a quadratic penalty on the log-ratio, ``beta`` without default).

Metrics (detached 0-d, token means over ``inputs.agg.tokens``): ``loss/policy``, the
aggregated loss; ``loss/approx_kl`` (all but ``cross_entropy``): ``mean(r - 1 - log r)``;
``loss/clip_frac`` (``cispo``): fraction of tokens whose weight is clipped.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ardea.algo.agg import agg_loss, masked_mean
from ardea.algo.policy_loss import CLIP, approx_kl, check_inputs
from ardea.algo.policy_loss_registry import Metrics, PolicyLossInputs, register_policy_loss


def _finish(inputs: PolicyLossInputs, m: Tensor, per_token: Tensor, **extra: Tensor):
    """``per_token`` aggregated, with ``loss/policy`` and the ``extra`` per-token metrics'
    token means."""
    loss = agg_loss(per_token, m, inputs.agg)
    means = {f"loss/{k}": masked_mean(v, m, inputs.agg.tokens) for k, v in extra.items()}
    return loss, {"loss/policy": loss.detach(), **means}


@register_policy_loss("cross_entropy")
def cross_entropy(inputs: PolicyLossInputs) -> tuple[Tensor, Metrics]:
    """Weighted negative log-likelihood ``l = -A * logprobs`` (module docstring)."""
    m = check_inputs(inputs, "advantages")
    return _finish(inputs, m, -inputs.logprobs * inputs.advantages)


@register_policy_loss("importance_sampling")
def importance_sampling(inputs: PolicyLossInputs) -> tuple[Tensor, Metrics]:
    """Importance-sampled REINFORCE ``l = -r * A``, ``r`` unclipped (module docstring)."""
    m = check_inputs(inputs, "old_logprobs", "advantages")
    log_ratio = inputs.logprobs - inputs.old_logprobs.detach()
    per_token = -torch.exp(log_ratio) * inputs.advantages  # (N, S)
    return _finish(inputs, m, per_token, approx_kl=approx_kl(log_ratio))


@register_policy_loss("cispo", options=CLIP)
def cispo(
    inputs: PolicyLossInputs, *, eps_clip: float = 0.2, eps_clip_higher: float | None = None
) -> tuple[Tensor, Metrics]:
    """CISPO ``l = -sg(clip(r, 1 - eps_clip, 1 + eps_clip_higher)) * logprobs * A``.

    ``eps_clip`` in (0, 1] (1: no lower bound), ``eps_clip_higher`` > 0 (None: ``eps_clip``).
    """
    high = eps_clip if eps_clip_higher is None else eps_clip_higher
    if not (math.isfinite(eps_clip) and 0 < eps_clip <= 1):
        raise ValueError(f"eps_clip must lie in (0, 1], got {eps_clip}")
    if not (math.isfinite(high) and high > 0):
        raise ValueError(f"eps_clip_higher must be a positive number, got {eps_clip_higher}")
    m = check_inputs(inputs, "old_logprobs", "advantages")
    log_ratio = inputs.logprobs - inputs.old_logprobs.detach()
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - eps_clip, 1.0 + high).detach()  # (N, S) constant
    per_token = -weight * inputs.logprobs * inputs.advantages
    clipped = (weight != ratio.detach()).to(weight.dtype)
    return _finish(inputs, m, per_token, approx_kl=approx_kl(log_ratio), clip_frac=clipped)


@register_policy_loss("dro", options=("beta",))
def dro(inputs: PolicyLossInputs, *, beta: float) -> tuple[Tensor, Metrics]:
    """DRO ``l = -(logprobs * A - beta / 2 * (logprobs - q)^2)``, ``beta`` >= 0."""
    if isinstance(beta, bool) or not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"dro's beta must be a finite number >= 0, got {beta!r}")
    m = check_inputs(inputs, "old_logprobs", "advantages")
    gap = inputs.logprobs - inputs.old_logprobs.detach()
    per_token = -(inputs.logprobs * inputs.advantages - 0.5 * beta * gap**2)
    return _finish(inputs, m, per_token, approx_kl=approx_kl(gap))

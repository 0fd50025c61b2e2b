"""Token-summed losses of one sequence, as the Tinker training API defines them.

Each takes ``logprobs (T,)`` — the trained policy's log-prob of each target token, with
gradient — and the per-token inputs of one datum, and returns the *elementwise* loss
``(T,)``; a request's loss is the plain sum of those over every token of every datum (no
mean, no normalisation: the caller weights tokens through ``weights`` or ``advantages``).
With ``q`` the sampler's log-probs, ``A`` the advantages and ``r = exp(logprobs - q)``:

- ``cross_entropy``: ``-logprobs * weights`` (weights may be any real number: a custom
  loss is sent back as ``weights = -dL/dlogprobs``);
- ``importance_sampling``: ``-r * A``;
- ``ppo``: ``-min(r A, clip(r, lo, hi) A)``, i.e. :func:`~ardea.algo.policy_loss.
  clipped_surrogate` with ``eps_clip = 1 - lo`` and ``eps_clip_higher = hi - 1``;
- ``cispo``: ``-sg(clip(r, lo, hi)) * logprobs * A`` (the clipped ratio is a constant
  weight; the gradient is the REINFORCE one, never zeroed by the clip);
- ``dro``: ``-(logprobs * A - beta/2 * (logprobs - q)^2)``.

``lo`` and ``hi`` are ratio thresholds (``clip_low_threshold``, default 0.8, and
``clip_high_threshold``, default 1.2); ``beta`` has no default. Inputs at positions a datum
does not train on are zeros (advantage 0, weight 0) and add nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from ardea.algo.policy_loss import clipped_surrogate

CLIP_LOW = 0.8
CLIP_HIGH = 1.2


def _ratio(logprobs: Tensor, sampler_logprobs: Tensor) -> Tensor:
    return torch.exp(logprobs - sampler_logprobs.detach())


def _thresholds(config: Mapping[str, float]) -> tuple[float, float]:
    low = float(config.get("clip_low_threshold", CLIP_LOW))
    high = float(config.get("clip_high_threshold", CLIP_HIGH))
    if not (math.isfinite(low) and math.isfinite(high) and 0.0 <= low < 1.0 < high):
        raise ValueError(
            f"clip thresholds must satisfy 0 <= clip_low_threshold < 1 < clip_high_threshold, "
            f"got {low} and {high}"
        )
    return low, high


def cross_entropy(logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping) -> Tensor:
    return -logprobs * inputs["weights"]


def importance_sampling(logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping) -> Tensor:
    return -_ratio(logprobs, inputs["logprobs"]) * inputs["advantages"]


def ppo(logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping) -> Tensor:
    low, high = _thresholds(config)
    if low == 0.0:  # the shared surrogate wants eps_clip < 1: a zero floor is a 1 - eps of 1
        raise ValueError("ppo needs clip_low_threshold > 0")
    log_ratio = logprobs - inputs["logprobs"].detach()
    loss, _, _ = clipped_surrogate(
        log_ratio, inputs["advantages"], eps_clip=1.0 - low, eps_clip_higher=high - 1.0
    )
    return loss


def cispo(logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping) -> Tensor:
    low, high = _thresholds(config)
    weight = _ratio(logprobs, inputs["logprobs"]).clamp(low, high).detach()
    return -weight * logprobs * inputs["advantages"]


def dro(logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping) -> Tensor:
    if "beta" not in config:
        raise ValueError("dro needs loss_fn_config {'beta': ...} (it has no default)")
    beta = float(config["beta"])
    if not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"dro's beta must be a finite number >= 0, got {beta}")
    gap = logprobs - inputs["logprobs"].detach()
    return -(logprobs * inputs["advantages"] - 0.5 * beta * gap**2)


TokenSumLoss = Callable[[Tensor, Mapping[str, Tensor], Mapping], Tensor]

# name -> (the loss, the loss_fn_inputs it reads besides target_tokens, its config keys)
TOKEN_SUM_LOSSES: dict[str, tuple[TokenSumLoss, tuple[str, ...], tuple[str, ...]]] = {
    "cross_entropy": (cross_entropy, ("weights",), ()),
    "importance_sampling": (importance_sampling, ("logprobs", "advantages"), ()),
    "ppo": (ppo, ("logprobs", "advantages"), ("clip_low_threshold", "clip_high_threshold")),
    "cispo": (cispo, ("logprobs", "advantages"), ("clip_low_threshold", "clip_high_threshold")),
    "dro": (dro, ("logprobs", "advantages"), ("beta",)),
}

"""The losses the Tinker API server serves: the policy losses of the same names
(:data:`ardea.algo.POLICY_LOSSES`, :mod:`ardea.algo.reinforce_loss`,
:mod:`ardea.algo.policy_loss`), read from a request as the Tinker API defines it.

A ``forward_backward`` request names a loss (``loss_fn``), gives per datum ``[T]`` arrays
(``loss_fn_inputs``: ``target_tokens`` and those the loss reads, :data:`SERVED`) and options
(``loss_fn_config``). Per datum the loss reads ``(1, T)`` :class:`~ardea.algo.PolicyLossInputs`:
``logprobs``, the trained policy's log-probs of the targets; ``old_logprobs``, the request's
``logprobs`` (the sampler's; ``cross_entropy`` reads none); ``advantages``, the request's
``advantages`` (``cross_entropy``: its ``weights``); every position counted; for ``gspo`` the
ratio mask, the nonzero positions of ``sequence_ratio_mask``. The loss is not reduced
(aggregation ``none``): its ``[T]`` values are the datum's elementwise loss, and the
request's loss is their plain sum over every token of every datum.

``clip_low_threshold`` ``lo`` (default 0.8) and ``clip_high_threshold`` ``hi`` (default 1.2)
are the ratio bounds, ``eps_clip = 1 - lo`` and ``eps_clip_higher = hi - 1``; ``dro``'s
``beta`` has no default. ``gspo``'s thresholds and their defaults are taken to be ``ppo``'s
(its page, tinker-docs.thinkingmachines.ai/tinker/losses/gspo, clips with the same
``1 - eps_low``, ``1 + eps_high``). ``stable_reinforce`` (the SDK's ``LossFnType``) is not
served: its objective reads per-sequence information the Tinker service records when it
samples (``record_stability_info``), which neither this server records nor the Tinker API
documents.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from ardea.algo import Aggregation, PolicyLoss, PolicyLossInputs
from ardea.service.tinker_wire import WireError

CLIP_LOW = 0.8
CLIP_HIGH = 1.2
THRESHOLDS = ("clip_low_threshold", "clip_high_threshold")
RL = ("logprobs", "advantages")

#: name -> (the loss_fn_inputs it reads besides target_tokens, its loss_fn_config keys)
SERVED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "cross_entropy": (("weights",), ()),
    "importance_sampling": (RL, ()),
    "ppo": (RL, THRESHOLDS),
    "cispo": (RL, THRESHOLDS),
    "dro": (RL, ("beta",)),
    "gspo": ((*RL, "sequence_ratio_mask"), THRESHOLDS),
}
UNREDUCED = Aggregation("none")


def _number(config: Mapping, key: str, default: float | None) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WireError(f"loss_fn_config[{key!r}]={value!r} must be a finite number")
    return float(value)


def loss_options(name: str, config: Mapping) -> dict[str, float]:
    """The options of the policy loss ``name`` from a request's ``loss_fn_config`` (keys
    already known to be ``name``'s), each checked as the Tinker API bounds it."""
    if name == "dro":
        if "beta" not in config:
            raise WireError("dro needs loss_fn_config {'beta': ...} (it has no default)")
        beta = _number(config, "beta", None)
        if beta < 0:
            raise WireError(f"dro's beta must be a finite number >= 0, got {beta}")
        return {"beta": beta}
    if SERVED[name][1] != THRESHOLDS:
        return {}
    low = _number(config, "clip_low_threshold", CLIP_LOW)
    high = _number(config, "clip_high_threshold", CLIP_HIGH)
    if not 0.0 <= low < 1.0 < high:
        raise WireError(
            f"clip thresholds must satisfy 0 <= clip_low_threshold < 1 < clip_high_threshold, "
            f"got {low} and {high}"
        )
    if low == 0.0 and name != "cispo":  # a clipped surrogate's floor is a 1 - eps_clip > 0
        raise WireError(f"{name} needs clip_low_threshold > 0")
    return {"eps_clip": 1.0 - low, "eps_clip_higher": high - 1.0}


def check_datum(name: str, row: Mapping[str, torch.Tensor], index: int) -> None:
    """What a datum's inputs must hold beyond their shapes: ``gspo``'s ratio mask marks a
    token (the mean of no log-ratio is not a ratio)."""
    if name == "gspo" and not bool((row["sequence_ratio_mask"] != 0).any()):
        raise WireError(f"data[{index}].loss_fn_inputs['sequence_ratio_mask'] marks no token")


def datum_inputs(name: str, logprobs: torch.Tensor, row: Mapping) -> PolicyLossInputs:
    """The ``(1, T)`` inputs of the loss ``name`` for one datum: ``logprobs [T]`` (with
    gradient) and the datum's ``[T]`` tensors ``row`` (module docstring)."""
    sampler = row["logprobs"] if "logprobs" in row else logprobs.detach()
    ratio_mask = row["sequence_ratio_mask"] != 0 if name == "gspo" else None
    return PolicyLossInputs(
        logprobs=logprobs[None],
        old_logprobs=sampler[None],
        advantages=row["weights" if name == "cross_entropy" else "advantages"][None],
        loss_mask=torch.ones_like(logprobs, dtype=torch.bool)[None],
        ratio_mask=None if ratio_mask is None else ratio_mask[None],
        agg=UNREDUCED,
    )


def datum_loss(
    loss: PolicyLoss, options: Mapping[str, float], logprobs: torch.Tensor, row: Mapping
) -> torch.Tensor:
    """The ``[T]`` elementwise loss of one datum: ``loss`` with ``options``
    (:func:`loss_options`) on ``logprobs [T]`` (with gradient) and the datum's ``row``."""
    elementwise, _ = loss.fn(datum_inputs(loss.name, logprobs, row), **options)
    return elementwise[0]

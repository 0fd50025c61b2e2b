"""The policy losses ``algo.policy_loss`` and the Tinker API server name: one signature.

Each entry of :data:`POLICY_LOSSES` is the formula itself, ``fn(inputs: PolicyLossInputs,
**options) -> (loss, metrics)``, registered by :func:`register_policy_loss`, which records
the keyword options it takes and whether its ratio needs a proximal policy as the
function's :class:`PolicyLoss` (``fn.policy_loss``). The trainer resolves
``algo.policy_loss`` once (:func:`get_policy_loss`), checks the config against what it
records, and then calls ``fn`` directly.

A config may also name a dotted path: a registered function, or a plain function
``fn(inputs, **options)``, which then takes every option of :data:`POLICY_OPTIONS` and no
proximal policy.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from ardea.algo.agg import TOKEN_MEAN, Aggregation
from ardea.registry import Registry, callable_check

POLICY_OPTIONS = ("eps_clip", "eps_clip_higher", "c_clip", "behav_imp_weight_cap")
"""The ``algo.ppo`` fields the trainer passes to a policy loss that takes them."""

Metrics = dict[str, Tensor]
PolicyLossFn = Callable[..., tuple[Tensor, Metrics]]


@dataclass(frozen=True)
class PolicyLossInputs:
    """What every policy loss reads: ``(N, S)`` next-token-aligned tensors and how to
    aggregate.

    ``logprobs``: the trained policy (with gradient); ``old_logprobs``: the ratio's
    denominator, the behaviour policy, or for a loss that ``needs_proximal`` the proximal
    policy (the trained policy before the step's updates); ``advantages`` (the per-token
    weights of ``cross_entropy``); ``loss_mask`` (bool or 0/1); ``behav_logprobs``: the
    behaviour policy, given exactly when the loss ``needs_proximal`` (its importance
    weight); ``ratio_mask``: the tokens a sequence-level ratio is taken over (GSPO; None:
    ``loss_mask``); ``agg``: the mode and the whole optimizer step's counts
    :func:`ardea.algo.agg_loss` reduces by (its counts None: this batch's own).
    """

    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    loss_mask: Tensor
    behav_logprobs: Tensor | None = None
    ratio_mask: Tensor | None = None
    agg: Aggregation = TOKEN_MEAN


@dataclass(frozen=True)
class PolicyLoss:
    """A policy loss as :func:`get_policy_loss` resolves it: its ``name`` (in messages), the
    formula ``fn``, the keyword ``options`` it takes, and whether it ``needs_proximal``: its
    ratio is taken against the proximal policy and ``inputs.behav_logprobs`` gives the
    behaviour weight (decoupled PPO)."""

    name: str
    fn: PolicyLossFn
    options: tuple[str, ...] = POLICY_OPTIONS
    needs_proximal: bool = False


POLICY_LOSSES: Registry[PolicyLossFn] = Registry(
    "policy loss", "policy losses", check=callable_check
)


def register_policy_loss(
    name: str, *, options: tuple[str, ...] = (), needs_proximal: bool = False
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator adding ``fn(inputs, **options)`` to :data:`POLICY_LOSSES` as ``name`` and
    recording its :class:`PolicyLoss` as ``fn.policy_loss``. Each of ``options`` must be a
    keyword parameter of ``fn`` (a typo is an error at import, not a silently ignored
    option)."""

    def decorate(fn: PolicyLossFn) -> PolicyLossFn:
        parameters = inspect.signature(fn).parameters
        missing = [o for o in options if o not in parameters]
        if missing:
            raise ValueError(f"policy loss {name!r} declares options {missing} it does not take")
        POLICY_LOSSES.register(name)(fn)
        fn.policy_loss = PolicyLoss(name, fn, tuple(options), needs_proximal)  # type: ignore
        return fn

    return decorate


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered as ``name``, or the function at a dotted path (a plain one
    takes every option of :data:`POLICY_OPTIONS` and no proximal policy). An unknown name
    lists the known ones."""
    fn = POLICY_LOSSES.get(name)
    declared = getattr(fn, "policy_loss", None)
    return declared if isinstance(declared, PolicyLoss) else PolicyLoss(name, fn)

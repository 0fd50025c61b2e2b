"""The policy losses ``algo.policy_loss`` names: one signature, declared options.

The registry ``algo.policy_loss`` names (:data:`POLICY_LOSSES`): each entry is a
:class:`PolicyLoss`, one signature for all, ``loss(PolicyLossInputs, **options)``, that
declares the ``algo.ppo`` options it takes and whether its ratio needs a proximal policy
(``ppo``: eps_clip, eps_clip_higher, c_clip, loss_agg_mode; ``decoupled_ppo``: the same plus
behav_imp_weight_cap, proximal; ``gspo``: eps_clip, eps_clip_higher, loss_agg_mode).

A config may also name a dotted path: a :class:`PolicyLoss` of the user's, or a plain
function ``fn(inputs, **options)``, which then takes every option and no proximal policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ardea.algo.policy_loss import (
    Metrics,
    decoupled_ppo_policy_loss,
    gspo_policy_loss,
    ppo_policy_loss,
)
from ardea.errors import ConfigError
from ardea.registry import Registry

POLICY_OPTIONS = ("eps_clip", "eps_clip_higher", "c_clip", "behav_imp_weight_cap", "loss_agg_mode")
"""The ``algo.ppo`` fields a policy loss may take as keyword options."""


@dataclass(frozen=True)
class PolicyLossInputs:
    """What every policy loss reads: ``(N, S)`` next-token-aligned tensors and the step's
    aggregation counts.

    ``logprobs``: the trained policy (with gradient); ``old_logprobs``: the ratio's
    denominator, the behaviour policy, or for a loss that ``needs_proximal`` the proximal
    policy (the trained policy before the step's updates); ``behav_logprobs``: the behaviour
    policy, given exactly when the loss ``needs_proximal`` (its importance weight);
    ``advantages``; ``loss_mask`` (bool or 0/1). ``global_tokens``, ``global_seqs``,
    ``horizon``: the whole optimizer step's counts :func:`ardea.algo.agg_loss` normalises by
    (None: this batch's own).
    """

    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    loss_mask: Tensor
    behav_logprobs: Tensor | None = None
    global_tokens: int | float | Tensor | None = None
    global_seqs: int | float | Tensor | None = None
    horizon: int | None = None

    def counts(self) -> dict[str, int | float | Tensor | None]:
        """The aggregation counts as :func:`ardea.algo.agg_loss`'s keyword arguments."""
        return dict(
            global_tokens=self.global_tokens, global_seqs=self.global_seqs, horizon=self.horizon
        )


@dataclass(frozen=True)
class PolicyLoss:
    """A policy loss of the registry: its ``name`` (in messages), ``fn(inputs:
    PolicyLossInputs, **options) -> (loss, metrics)``, the ``options`` it takes (a subset of :data:`POLICY_OPTIONS`, passed from
    ``algo.ppo`` by the trainer; setting any other one is a config error, never ignored),
    and whether it ``needs_proximal``: its ratio is taken against the proximal policy and
    ``inputs.behav_logprobs`` gives the behaviour weight (decoupled PPO)."""

    name: str
    fn: Callable[..., tuple[Tensor, Metrics]]
    options: tuple[str, ...] = POLICY_OPTIONS
    needs_proximal: bool = False

    def __post_init__(self) -> None:
        unknown = [name for name in self.options if name not in POLICY_OPTIONS]
        if unknown:
            raise ValueError(
                f"policy loss {self.name!r}: options {unknown} are not algo.ppo options a policy loss can "
                f"take: {', '.join(POLICY_OPTIONS)}"
            )

    def __call__(self, inputs: PolicyLossInputs, **options: Any) -> tuple[Tensor, Metrics]:
        """Run the loss; an option it does not take, or ``behav_logprobs`` given to a loss
        without a proximal policy (or missing from one with), is an error."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise TypeError(
                f"policy loss {self.name!r} does not take {', '.join(unknown)}; "
                f"it takes {', '.join(self.options) or 'no options'}"
            )
        if self.needs_proximal and inputs.behav_logprobs is None:
            raise ValueError(f"policy loss {self.name!r} needs behav_logprobs (N, S)")
        if not self.needs_proximal and inputs.behav_logprobs is not None:
            raise ValueError(
                f"policy loss {self.name!r} takes no behav_logprobs: its ratio is "
                "against old_logprobs alone"
            )
        return self.fn(inputs, **options)


def _policy_loss_check(name: str, entry: object) -> None:
    if not (isinstance(entry, PolicyLoss) or callable(entry)):
        raise ConfigError(f"{name!r} is a {type(entry).__name__}, not a PolicyLoss or function")


POLICY_LOSSES: Registry[PolicyLoss] = Registry(
    "policy loss", "policy losses", check=_policy_loss_check
)


def get_policy_loss(name: str) -> PolicyLoss:
    """The registered policy loss ``name``, or the object at a dotted path: a
    :class:`PolicyLoss`, or a function ``fn(inputs, **options)`` (it then takes every option
    of :data:`POLICY_OPTIONS` and no proximal policy). An unknown name lists the known ones."""
    entry = POLICY_LOSSES.get(name)
    return entry if isinstance(entry, PolicyLoss) else PolicyLoss(name, entry)


def _ratio_entry(formula: Callable[..., tuple[Tensor, Metrics]]) -> Callable[..., Any]:
    """``formula(logprobs, old_logprobs, advantages, loss_mask, **options, **counts)`` read
    from one :class:`PolicyLossInputs`."""

    def entry(inputs: PolicyLossInputs, **options: Any) -> tuple[Tensor, Metrics]:
        tensors = (inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.loss_mask)
        return formula(*tensors, **options, **inputs.counts())

    return entry


def _decoupled_ppo_entry(inputs: PolicyLossInputs, **options: Any) -> tuple[Tensor, Metrics]:
    """Decoupled PPO: the proximal policy is ``old_logprobs``, the weight's denominator
    ``behav_logprobs``."""
    tensors = (inputs.logprobs, inputs.old_logprobs, inputs.behav_logprobs)
    rest = (inputs.advantages, inputs.loss_mask)
    return decoupled_ppo_policy_loss(*tensors, *rest, **options, **inputs.counts())


_CLIP = ("eps_clip", "eps_clip_higher", "loss_agg_mode")
ppo_loss = POLICY_LOSSES.register("ppo")(
    PolicyLoss("ppo", _ratio_entry(ppo_policy_loss), (*_CLIP, "c_clip"))
)
decoupled_ppo_loss = POLICY_LOSSES.register("decoupled_ppo")(
    PolicyLoss(
        "decoupled_ppo",
        _decoupled_ppo_entry,
        (*_CLIP, "c_clip", "behav_imp_weight_cap"),
        needs_proximal=True,
    )
)
gspo_loss = POLICY_LOSSES.register("gspo")(
    PolicyLoss("gspo", _ratio_entry(gspo_policy_loss), _CLIP)
)

"""What the policy-gradient strategies share (``grpo``, ``online_grpo``, ``online_ppo``): the
policy loss chosen by ``algo.policy_loss`` and checked against ``algo.ppo``, the step's
normalising counts, the policy's forward pass, and the loss with its metrics.

The loss itself is the formula registered in :data:`ardea.algo.POLICY_LOSSES` (e.g.
:func:`ardea.algo.ppo`), resolved once into an :class:`ardea.algo.PolicyLoss` and called
with one :class:`ardea.algo.PolicyLossInputs`; its metrics are logged under the names it
gives them (``loss/policy``, ``loss/clip_frac``, ``loss/dual_clip_frac``,
``loss/approx_kl``, and for decoupled PPO ``loss/behav_imp_weight`` and
``loss/behav_drop_frac``), token means over the whole step so that the micro-batches'
values add up to the step's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ardea.algo import (
    POLICY_OPTIONS,
    Aggregation,
    PolicyLoss,
    PolicyLossInputs,
    correction_weights,
    get_policy_loss,
    masked_mean,
    mismatch_metrics,
)
from ardea.config.mismatch import MismatchConfig
from ardea.config.ppo import PPOConfig
from ardea.data import TrajectoryBatch
from ardea.errors import ConfigError
from ardea.model import LogprobOutput, sequence_logprobs
from ardea.trainer.moe_terms import MoETerms
from ardea.trainer.strategies.base import Strategy

PPO_DEFAULTS = PPOConfig()


def policy_loss_name(config: Any, *, online: bool) -> str:
    """``algo.policy_loss``, or its default: decoupled PPO when online rollouts may be stale
    (``rollout.max_staleness > 0``), else PPO."""
    if config.algo.policy_loss is not None:
        return config.algo.policy_loss
    return "decoupled_ppo" if online and config.rollout.max_staleness > 0 else "ppo"


def resolve_policy_loss(name: str, ppo: PPOConfig) -> PolicyLoss:
    """The policy loss ``name`` (a :class:`ConfigError` listing the known ones), after
    checking, once, that ``algo.ppo`` gives every option it takes and sets no option it
    does not take away from its default."""
    try:
        loss = get_policy_loss(name)
    except ConfigError as error:
        raise ConfigError(f"algo.policy_loss: {error}") from None
    foreign = [option for option in loss.options if option not in POLICY_OPTIONS]
    if foreign:
        raise ConfigError(
            f"algo.policy_loss={name!r} takes {', '.join(foreign)}, which algo.ppo does not "
            f"have (a loss for the Tinker API server, whose requests give it); choose one "
            f"that takes only {', '.join(POLICY_OPTIONS)}"
        )
    unused = [
        option
        for option in POLICY_OPTIONS
        if option not in loss.options and getattr(ppo, option) != getattr(PPO_DEFAULTS, option)
    ]
    if unused:
        set_ = ", ".join(f"algo.ppo.{o}={getattr(ppo, o)!r}" for o in unused)
        raise ConfigError(
            f"algo.policy_loss={name!r} does not take {set_}; unset it or choose another "
            f"algo.policy_loss (it takes {', '.join(loss.options) or 'no options'})"
        )
    return loss


def check_mismatch(mismatch: MismatchConfig, loss: PolicyLoss, *, online: bool) -> None:
    """``algo.mismatch`` needs rollouts from an engine and a loss it can weight: the ratio
    is taken against the proximal policy, which decoupled PPO already weights by its own
    rule (it is ppo with token_mis, low 0 and high behav_imp_weight_cap), and GSPO's
    sequence ratio takes only the per-sequence modes."""
    if mismatch.mode == "none":
        return
    where = f"algo.mismatch.mode={mismatch.mode!r}"
    if not online:
        raise ConfigError(f"{where} corrects rollouts of an engine: it is for online strategies")
    if loss.needs_proximal:
        raise ConfigError(
            f"{where} with algo.policy_loss={loss.name!r} (the default when "
            "rollout.max_staleness > 0): decoupled PPO weights the tokens itself; set "
            "algo.policy_loss=ppo to use the correction"
        )
    if loss.name == "gspo" and mismatch.mode.startswith("token"):
        raise ConfigError(f"{where} with GSPO's sequence ratio: choose seq_tis or seq_mis")


def needs_proximal(strategy: Strategy) -> bool:
    """Whether the rollout needs the policy's log-probs before the updates pinned."""
    return strategy.policy_loss.needs_proximal or strategy.config.algo.mismatch.mode != "none"


def rl_step_counts(micro_batches: list[TrajectoryBatch], moe: MoETerms) -> dict[str, float]:
    """The normalisers of one optimizer step over its micro-batches: trained ``tokens`` and
    ``seqs`` (next-token aligned), ``rows``, the ``horizon`` (longest row), the sums of the
    trajectories' rewards and squared rewards (for their mean and population std), and the
    MoE routed tokens. Every entry but ``horizon`` (a maximum) adds up across ranks."""
    masks = [b.action_mask for b in micro_batches]
    rewards = torch.cat([b.rewards.detach().double() for b in micro_batches])
    summed = torch.stack(  # read back in one transfer
        [
            sum(m.sum(dtype=torch.float64) for m in masks),
            sum(m.any(dim=-1).sum(dtype=torch.float64) for m in masks),
            rewards.sum(),
            rewards.square().sum(),
        ]
    ).tolist()
    counts = dict(zip(("tokens", "seqs", "reward_sum", "reward_sq_sum"), summed, strict=True))
    counts |= {"rows": float(rewards.numel()), "horizon": float(max(m.shape[-1] for m in masks))}
    return counts | moe.step_counts(micro_batches)


def step_aggregation(step_counts: dict[str, float], mode: str) -> Aggregation:
    """``mode`` (``algo.ppo.loss_agg_mode``) over the step's counts: its tokens, sequences
    and horizon (:func:`rl_step_counts`)."""
    return Aggregation(
        mode, step_counts["tokens"], step_counts["seqs"], int(step_counts["horizon"])
    )


def policy_objective(
    ppo: PPOConfig,
    loss_fn: PolicyLoss,
    logprobs: Tensor,
    batch: TrajectoryBatch,
    agg: Aggregation,
    *,
    old: Tensor,
    mismatch: MismatchConfig | None = None,
    first_update: bool = True,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy loss and its metrics (module docstring), all ``(N, S)`` next-token
    aligned, aggregated as ``agg`` says. ``old`` is the ratio's denominator: the behaviour policy, or for a loss that
    ``needs_proximal`` the proximal policy (the behaviour log-probs then give the weight).
    With ``mismatch`` (``algo.mismatch``) set, ``old`` is the proximal policy and each token's
    loss is weighted by :func:`ardea.algo.correction_weights` (the weight multiplies the
    advantage, which for a weight >= 0 is the same as weighting the clipped loss). The
    metrics are 0-d tensors, read once per update by the trainer; ``mismatch/*`` only when
    ``first_update``."""
    mask, advantages = batch.action_mask, batch.advantages.to(logprobs.dtype)
    corrections = {}
    if mismatch is not None and mismatch.mode != "none":
        weights = correction_weights(
            batch.proximal_logprobs, batch.behaviour_logprobs, mask, mode=mismatch.mode,
            cap=mismatch.cap, low=mismatch.low, high=mismatch.high,
        ).to(logprobs.dtype)  # fmt: skip
        advantages = advantages * weights
        corrections = {
            "mismatch/correction_weight_mean": masked_mean(weights, mask, agg.tokens),
            "mismatch/correction_masked_frac": masked_mean(
                (weights == 0).to(weights.dtype), mask, agg.tokens
            ),
        }
    behaviour = batch.behaviour_logprobs if loss_fn.needs_proximal else None
    inputs = PolicyLossInputs(
        logprobs=logprobs,
        old_logprobs=old.to(logprobs.dtype),
        advantages=advantages,
        loss_mask=mask,
        behav_logprobs=None if behaviour is None else behaviour.to(logprobs.dtype),
        agg=agg,
    )
    loss, parts = loss_fn.fn(inputs, **{name: getattr(ppo, name) for name in loss_fn.options})
    metrics = {name: value.detach() for name, value in parts.items()}
    raw = batch.advantages.to(logprobs.dtype)
    metrics["train/advantage_mean"] = masked_mean(raw, mask, agg.tokens).detach()
    metrics |= {name: value.detach() for name, value in corrections.items()}
    # the engine's behaviour log-probs against the trainer's: before the step's first
    # optimizer update only (later updates' values are not kept, so not computed)
    if batch.logprobs is not None and first_update:
        gap = mismatch_metrics(logprobs, batch.behaviour_logprobs, mask, agg)
        metrics |= {name: value.detach() for name, value in gap.items()}
    return loss, metrics


def policy_forward(strategy: Strategy, batch: TrajectoryBatch) -> LogprobOutput:
    """The policy's next-token log-probs and entropies of ``batch`` at its temperature,
    and its log-probs of a distillation teacher's top tokens when they are pinned."""
    return sequence_logprobs(
        strategy.policy,
        **batch.model_inputs(),
        chunk_size=strategy.config.model.logprob_chunk_size,
        with_entropy=True,
        logprobs_at=batch.teacher_top_ids,
        **batch.sampling(),
    )


def ratio_reference(batch: TrajectoryBatch) -> Tensor:
    """The online ratio's reference: pinned proximal log-probs (decoupled), else behaviour."""
    if batch.proximal_logprobs is not None:
        return batch.proximal_logprobs
    return batch.behaviour_logprobs

"""Advantage estimators behind one registry with one signature.

Every estimator is ``fn(inputs: EstimatorInputs) -> AdvantageOutputs``: it receives the
next-token-aligned ``(N, S)`` rewards, mask and values of a batch plus per-trajectory group
labels, and returns ``(N, S)`` advantages and returns that are 0 outside ``loss_mask``. The
caller (:func:`ardea.algo.pipeline.compute_advantages`) never special-cases an entry.

A trajectory's return ``R_i`` for the outcome-based estimators is its outcome score plus
the sum of its per-token KL rewards (0 when no KL is folded into rewards). ``G`` is the
size of the trajectory's group; groups may differ in size.

==========================  ==========================================================
name                        advantage (broadcast to all trained tokens unless noted)
==========================  ==========================================================
``gae``                     token- or turn-level GAE with a critic (Schulman et al. 2016)
``grpo``                    ``(R_i - mean_g) / (std_g + 1e-8)`` (Shao et al. 2024, DeepSeekMath)
``dr_grpo``                 ``R_i - mean_g`` (Liu et al. 2025, "Understanding R1-Zero-Like
                            Training"; no std division)
``rloo``                    ``R_i - mean_{j != i} R_j = G/(G-1) (R_i - mean_g)``
                            (Ahmadian et al. 2024)
``reinforce_pp``            per-token discounted return ``sum_k gamma^k r_{t+k}``, whitened
                            over all trained tokens of the batch (Hu 2025, REINFORCE++)
``reinforce_pp_baseline``   ``R_i - mean_g``, then whitened over the batch's trained tokens
==========================  ==========================================================

Deviations: a group of one trajectory has no baseline; ``grpo``, ``dr_grpo`` and ``rloo``
give it advantage 0 (the GRPO formula does this by itself; for RLOO it is a choice). The
group std is the population std (``unbiased=False``), as in the seed's GRPO.
``returns`` is the critic target for ``gae`` and the un-normalized return signal
(``R_i``, or the discounted token return) for the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from ardea.algo.gae import compute_token_level_gae, compute_turn_level_gae
from ardea.algo.normalize import NORM_EPS, group_stats, masked_whiten
from ardea.registry import Registry, callable_check


@dataclass(frozen=True)
class EstimatorInputs:
    """What every advantage estimator receives; all ``(N, S)`` tensors are next-token aligned.

    Attributes:
        task_rewards: ``(N, S)`` outcome reward at each trajectory's last trained position.
        kl_rewards: ``(N, S)`` per-token KL reward ``-kl_ctl * KL`` (0 where untrained).
        scores: ``(N,)`` outcome reward per trajectory (after shaping and normalization).
        loss_mask: ``(N, S)`` bool, trained positions.
        values: ``(N, S)`` critic values (zeros without a critic).
        group_ids: ``(N,)`` integer group label (prompt) per trajectory, or None (then the
            group-based estimators raise).
        seq_no_eos_mask: ``(N,)`` bool, True for truncated trajectories.
        bootstrap_values: ``(N,)`` value after the last token of each trajectory.
        discount: ``gamma``.
        gae_lambda: float or ``(N,)`` tensor.
        timestep_unit: ``'token'`` or ``'turn'`` (GAE only).
        turn_ids: ``(N, S)`` integer turn ids, or None (required for turn units).
        process_rewards: ``(N, S)`` per-token (process) rewards, e.g. a teacher's
            ``-coef * KL`` on each sampled token, or None (zeros). They stay with their
            token: GAE at the token unit and REINFORCE++ take them as rewards, every other
            estimator adds each token's own to its advantage (after any group
            normalisation, so they are not rescaled by the group's std).
    """

    task_rewards: Tensor
    kl_rewards: Tensor
    scores: Tensor
    loss_mask: Tensor
    values: Tensor
    group_ids: Tensor | None
    seq_no_eos_mask: Tensor
    bootstrap_values: Tensor
    discount: float = 1.0
    gae_lambda: float | Tensor = 1.0
    timestep_unit: str = "token"
    turn_ids: Tensor | None = None
    process_rewards: Tensor | None = None

    @property
    def token_rewards(self) -> Tensor:
        """``(N, S)`` process rewards, 0 where untrained (zeros when there are none)."""
        if self.process_rewards is None:
            return torch.zeros_like(self.kl_rewards)
        return torch.where(self.loss_mask, self.process_rewards, 0.0)

    @property
    def total_rewards(self) -> Tensor:
        """``(N, S)`` outcome plus KL reward per token (process rewards apart)."""
        return self.task_rewards + self.kl_rewards

    def with_own_tokens(self, advantages: Tensor) -> Tensor:
        """``advantages`` plus each trained token's own process reward."""
        if self.process_rewards is None:
            return advantages
        return advantages + self.token_rewards

    @property
    def returns_per_trajectory(self) -> Tensor:
        """``(N,)`` ``R_i`` = outcome score + summed KL rewards."""
        return self.scores + self.kl_rewards.sum(dim=-1)


class AdvantageOutputs(NamedTuple):
    """``advantages`` and ``returns``, both ``(N, S)``, 0 outside ``loss_mask``."""

    advantages: Tensor
    returns: Tensor


AdvantageEstimator = Callable[[EstimatorInputs], AdvantageOutputs]
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry(
    "advantage estimator", "estimators", check=callable_check
)


def register_advantage(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator registering ``fn(inputs: EstimatorInputs) -> AdvantageOutputs`` as ``name``."""
    return ADVANTAGE_ESTIMATORS.register(name)


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """A registered estimator, or the function at dotted path ``package.module.function``.

    Raises:
        ConfigError (a ValueError): an unknown name (the message lists the registered
            ones) or a path that does not import.
    """
    return ADVANTAGE_ESTIMATORS.get(name)


def _broadcast(per_traj: Tensor, mask: Tensor) -> Tensor:
    """``(N,)`` -> ``(N, S)``: the trajectory's value on trained tokens, 0 elsewhere."""
    return torch.where(mask, per_traj[:, None], 0.0)


def _group_stats(inputs: EstimatorInputs, name: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(R, mean_g, std_g, size_g)``, each ``(N,)``; needs ``group_ids``."""
    if inputs.group_ids is None:
        raise ValueError(f"advantage estimator {name!r} needs batch['group_ids'] (N,)")
    returns = inputs.returns_per_trajectory
    return (returns, *group_stats(returns, inputs.group_ids))


@register_advantage("gae")
def gae_advantages(inputs: EstimatorInputs) -> AdvantageOutputs:
    """Critic-based GAE at the configured time-step unit.

    Token unit: token-level GAE on ``task_rewards + kl_rewards + process_rewards``. Turn
    unit: turn-level GAE on ``task_rewards`` only (critic returns stay task-only), then each
    token's own KL and process rewards are added to its advantage (they stay token-local).
    """
    mask = inputs.loss_mask
    common = dict(
        values=inputs.values,
        loss_mask=mask,
        seq_no_eos_mask=inputs.seq_no_eos_mask,
        bootstrap_values=inputs.bootstrap_values,
        discount=inputs.discount,
        gae_lambda=inputs.gae_lambda,
    )
    if inputs.timestep_unit == "token":
        rewards = inputs.total_rewards + inputs.token_rewards
        adv, ret = compute_token_level_gae(rewards=rewards, **common)
    elif inputs.timestep_unit == "turn":
        if inputs.turn_ids is None:
            raise ValueError("gae_timestep_unit='turn' requires rollout data with turn_ids")
        adv, ret = compute_turn_level_gae(
            rewards=inputs.task_rewards, turn_ids=inputs.turn_ids, **common
        )
        adv = inputs.with_own_tokens(adv + inputs.kl_rewards)
    else:
        raise ValueError(
            f"gae_timestep_unit must be 'token' or 'turn', got {inputs.timestep_unit!r}"
        )
    return AdvantageOutputs(torch.where(mask, adv, 0.0), torch.where(mask, ret, 0.0))


@register_advantage("grpo")
def grpo_advantages(inputs: EstimatorInputs) -> AdvantageOutputs:
    """GRPO: ``A_i = (R_i - mean_g) / (std_g + 1e-8)`` on every trained token of ``i``."""
    returns, mean, std, _ = _group_stats(inputs, "grpo")
    adv = (returns - mean) / (std + NORM_EPS)
    return AdvantageOutputs(
        inputs.with_own_tokens(_broadcast(adv, inputs.loss_mask)),
        _broadcast(returns, inputs.loss_mask),
    )


@register_advantage("dr_grpo")
def dr_grpo_advantages(inputs: EstimatorInputs) -> AdvantageOutputs:
    """Dr. GRPO: ``A_i = R_i - mean_g`` (no division by the group std)."""
    returns, mean, _, _ = _group_stats(inputs, "dr_grpo")
    return AdvantageOutputs(
        inputs.with_own_tokens(_broadcast(returns - mean, inputs.loss_mask)),
        _broadcast(returns, inputs.loss_mask),
    )


@register_advantage("rloo")
def rloo_advantages(inputs: EstimatorInputs) -> AdvantageOutputs:
    """RLOO: ``A_i = R_i - (sum_{j in g, j != i} R_j) / (G - 1)``; 0 for a group of one."""
    returns, mean, _, size = _group_stats(inputs, "rloo")
    scale = torch.where(size > 1, size / (size - 1).clamp(min=1.0), 0.0)
    adv = scale * (returns - mean)
    return AdvantageOutputs(
        inputs.with_own_tokens(_broadcast(adv, inputs.loss_mask)),
        _broadcast(returns, inputs.loss_mask),
    )


@register_advantage("reinforce_pp")
def reinforce_pp_advantages(inputs: EstimatorInputs) -> AdvantageOutputs:
    """REINFORCE++: ``G_t = r_t + gamma * G_next`` over trained tokens, batch-whitened.

    ``G_t`` is token-level GAE with ``V = 0`` and ``lambda = 1`` (same skipping of untrained
    positions); ``A = (G - mean) / (std + 1e-8)`` over all trained tokens of the batch.
    """
    mask = inputs.loss_mask
    rows = mask.shape[0]
    zeros = torch.zeros_like(inputs.task_rewards)
    returns, _ = compute_token_level_gae(
        rewards=inputs.total_rewards + inputs.token_rewards,
        values=zeros,
        loss_mask=mask,
        seq_no_eos_mask=torch.zeros(rows, dtype=torch.bool, device=mask.device),
        bootstrap_values=zeros[:, 0] if zeros.shape[1] else zeros.new_zeros(rows),
        discount=inputs.discount,
        gae_lambda=1.0,
    )
    returns = torch.where(mask, returns, 0.0)
    return AdvantageOutputs(masked_whiten(returns, mask), returns)


@register_advantage("reinforce_pp_baseline")
def reinforce_pp_baseline_advantages(inputs: EstimatorInputs) -> AdvantageOutputs:
    """REINFORCE++-baseline: ``R_i - mean_g`` on trained tokens, then batch-whitened."""
    mask = inputs.loss_mask
    returns, mean, _, _ = _group_stats(inputs, "reinforce_pp_baseline")
    centered = _broadcast(returns - mean, mask)
    whitened = masked_whiten(centered, mask)
    return AdvantageOutputs(inputs.with_own_tokens(whitened), _broadcast(returns, mask))

"""Offline GRPO (``grpo``): group-relative advantages, a clipped policy loss, KL to a reference.

Reference: Shao et al. 2024 (DeepSeekMath, GRPO): per prompt, G scored completions; each
completion's advantage is its group-normalized reward ``(R_i - mean_g) / (std_g + 1e-8)``,
broadcast over its completion tokens; the loss is PPO's clipped surrogate plus
``kl_ctl * KL(pi || pi_ref)`` as a loss term (not a reward penalty). Every formula lives in
:mod:`ardea.algo`: advantages from :func:`ardea.algo.compute_advantages` with the registered
estimator ``algo.ppo.adv_estimator``, the policy loss from the registry
(``algo.policy_loss``: ``ppo`` with ``eps_clip``, ``eps_clip_higher``, ``c_clip``;
``decoupled_ppo``; ``gspo``; ``cispo``, ``importance_sampling``, ``cross_entropy``;
:mod:`ardea.trainer.strategies.policy_gradient`), aggregated by ``loss_agg_mode``, the KL
from :func:`ardea.algo.kl_penalty` (``kl_estimator``), aggregated like the policy loss.

Three policies (seed 002's roles):

- the policy being trained;
- the old policy of the ratio: the batch's behaviour log-probs when it has them, else the
  policy as it is before the step's one optimizer update, i.e. the policy's own log-probs
  detached (an offline step is one update, so the old policy equals the policy throughout
  it and the ratio is 1, as with seed 002's old-policy copy re-synced after every step,
  without keeping a second, possibly sharded, copy); with ``decoupled_ppo`` those detached
  log-probs are the proximal policy and the batch's behaviour log-probs (required) give the
  behaviour weight;
- the reference for the KL term: ``make_reference()`` (the initial policy), frozen; built
  only when ``algo.ppo.kl_ctl > 0``.

Deviations: ``algo.ppo.adv_estimator`` null means ``grpo``; ``gae`` needs a critic that this
strategy does not have and is a config error; every other registered estimator or dotted
path is used as configured. KL is not folded into rewards here (``kl_ctl`` weights the loss
term). Offline, advantages are computed per micro-batch: exact for the group estimators
because a micro-batch holds whole groups (one ``GroupSample`` is a prompt with all its
completions), while batch-wide normalizations (``reward_norm`` / ``adv_norm = batch``,
``reinforce_pp``) see the micro-batch. ``seq-mean-token-sum-norm`` uses the step's longest
row as its horizon. The trainer's log-probs use the batch's temperature (the one its
behaviour log-probs were sampled at; 1 for data files).

Metrics (token means over the step's trained tokens unless noted; sums over micro-batches
give the step value): ``train/loss``, the policy loss's own ``loss/*`` metrics
(``loss/policy``, ``loss/clip_frac``, ``loss/dual_clip_frac``, ``loss/approx_kl``: k3
estimate of KL(old || pi); ``loss/behav_imp_weight`` and ``loss/behav_drop_frac`` with
decoupled PPO), ``train/kl`` (with a reference), ``train/entropy``,
``train/advantage_mean``, ``train/reward_mean`` and ``train/reward_std`` (population std;
both over the step's completions), and the MoE metrics.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from ardea import data
from ardea.algo import Aggregation, agg_loss, compute_advantages, kl_penalty, masked_mean
from ardea.config.ppo import PPOConfig
from ardea.data import TrajectoryBatch
from ardea.errors import ConfigError
from ardea.trainer.moe_terms import MoETerms
from ardea.trainer.scorers.teacher import forward_kl_term
from ardea.trainer.strategies.base import OnlineStrategy, Strategy, register_strategy
from ardea.trainer.strategies.policy_gradient import (
    check_mismatch,
    policy_forward,
    policy_loss_name,
    policy_objective,
    ratio_reference,
    resolve_policy_loss,
    rl_step_counts,
    step_aggregation,
)

CRITIC_ESTIMATORS = ("gae",)  # estimators that need a critic


def advantage_config(ppo: PPOConfig) -> PPOConfig:
    """``algo.ppo`` as the advantage pipeline should see it here: no KL folded into rewards
    (GRPO's KL is a loss term) and a critic-free estimator."""
    estimator = ppo.adv_estimator or "grpo"
    if estimator in CRITIC_ESTIMATORS:
        raise ConfigError(
            f"algo.ppo.adv_estimator={estimator!r} needs a critic, which grpo does not train; "
            "use grpo, dr_grpo, rloo, reinforce_pp or reinforce_pp_baseline (or null)"
        )
    return dataclasses.replace(ppo, kl_ctl=0.0, adv_estimator=estimator)


@register_strategy("grpo")
class GRPOStrategy(Strategy):
    """GRPO on offline groups with a synced old-policy copy (module docstring)."""

    sample_kind = "group"

    @classmethod
    def wants_reference(cls, config: Any) -> bool:
        """A frozen reference only for the KL term (``algo.ppo.kl_ctl > 0``)."""
        return bool(config.algo.ppo.kl_ctl)

    def __init__(self, policy: nn.Module, config: Any, **kwargs: Any) -> None:
        super().__init__(policy, config, **kwargs)
        self.ppo = config.algo.ppo
        self.adv_config = advantage_config(self.ppo)
        self.kl_ctl = float(self.ppo.kl_ctl)
        self.loss_name = policy_loss_name(config, online=isinstance(self, OnlineStrategy))
        self.policy_loss = resolve_policy_loss(self.loss_name, self.ppo)
        check_mismatch(
            config.algo.mismatch, self.policy_loss, online=isinstance(self, OnlineStrategy)
        )
        self.moe = MoETerms(policy, config.algo.moe_aux_loss_coef)

    def collate(self, samples: Sequence[Any]) -> TrajectoryBatch:
        return data.collate_groups(samples, self.tokenizer.pad_token_id)

    def step_counts(self, micro_batches: list[TrajectoryBatch]) -> dict[str, float]:
        return rl_step_counts(micro_batches, self.moe)

    def group_advantages(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        """``batch`` with the estimator's advantages pinned (next-token aligned); its pinned
        per-token ``process_rewards (N, S)`` join them as :class:`ardea.algo.EstimatorInputs`
        says."""
        inputs = batch.advantage_inputs()
        advantages = compute_advantages(inputs, self.adv_config).advantages
        return batch.pin(advantages=advantages)

    def _old_logprobs(self, batch: TrajectoryBatch, logprobs: Tensor) -> Tensor:
        """The ratio's reference (module docstring): offline the policy's own ``logprobs``
        detached when the batch has no behaviour log-probs or the loss is decoupled, else
        :func:`ratio_reference`."""
        offline = not isinstance(self, OnlineStrategy)
        if offline and (batch.logprobs is None or self.policy_loss.needs_proximal):
            return logprobs.detach()
        return ratio_reference(batch)

    def loss(
        self, batch: TrajectoryBatch, step_counts: dict[str, float]
    ) -> tuple[Tensor, dict[str, Tensor | float]]:
        if batch.advantages is None:  # offline: advantages of this micro-batch's groups
            batch = self.group_advantages(batch)
        mask = batch.action_mask  # (N, S) bool
        out = policy_forward(self, batch)
        agg = step_aggregation(step_counts, self.ppo.loss_agg_mode)
        policy_loss, metrics = policy_objective(
            self.ppo,
            self.policy_loss,
            out.logprobs,
            batch,
            agg,
            old=self._old_logprobs(batch, out.logprobs),
            mismatch=self.config.algo.mismatch,
            first_update=step_counts.get("update", 0.0) == 0.0,
        )
        metrics["train/entropy"] = masked_mean(out.entropy, mask, agg.tokens).detach()
        loss = policy_loss + self._kl_term(batch, out.logprobs, agg, metrics)
        loss = loss + forward_kl_term(self.config, batch, out.logprobs_at, agg, metrics)
        metrics |= self._reward_metrics(batch, step_counts)
        loss, moe_metrics = self.moe.add(loss, out, batch, step_counts)
        return loss, {"train/loss": loss.detach(), **metrics, **moe_metrics}

    def _kl_term(
        self, batch: TrajectoryBatch, logprobs: Tensor, agg: Aggregation, metrics: dict
    ) -> Tensor | float:
        """``kl_ctl * agg_loss(KL(pi || pi_ref))`` aggregated like the policy loss (as
        ``agg`` says); records ``train/kl``. 0 without a reference."""
        if self.reference is None:
            return 0.0
        ref = batch.ref_logprobs  # pinned on an online rollout
        if ref is None:  # offline: one update per step, so once per step too
            ref = self.reference.logprobs(batch)
        mask = batch.action_mask
        kl = kl_penalty(logprobs, ref, self.ppo.kl_estimator)  # (N, S)
        kl_loss = agg_loss(kl, mask, agg)
        metrics["train/kl"] = masked_mean(kl, mask, agg.tokens).detach()
        return self.kl_ctl * kl_loss

    @staticmethod
    def _reward_metrics(batch: TrajectoryBatch, step_counts: dict[str, float]) -> dict:
        """Reward mean and population std over the step's completions (all ranks), split
        by this batch's row share so the shares add up to the step's values."""
        rows = max(step_counts["rows"], 1.0)
        mean = step_counts["reward_sum"] / rows
        std = math.sqrt(max(step_counts["reward_sq_sum"] / rows - mean * mean, 0.0))
        share = batch.rows / rows
        return {"train/reward_mean": mean * share, "train/reward_std": std * share}

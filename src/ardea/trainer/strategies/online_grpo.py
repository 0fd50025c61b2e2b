"""Online GRPO (``online_grpo``): the GRPO loss on fresh rollouts of the live policy.

The RL step (:mod:`ardea.trainer.step.rl_step`) samples ``rollout.group_size`` completions per
prompt with the engine (behaviour log-probs recorded) and scores them with
``reward.functions`` (plus DAPO's overlong penalty when ``reward.overlong_buffer > 0``); the
loss of :mod:`ardea.trainer.strategies.grpo` then runs on that rollout with the behaviour
log-probs as the ratio's denominator, so no old-policy copy is kept.

Pinned on the whole rollout before any update (:meth:`OnlineGRPOStrategy.pin`): the group
advantages of ``algo.ppo.adv_estimator`` (``grpo`` by default; ``dr_grpo``, ``rloo``,
``reinforce_pp``, ``reinforce_pp_baseline`` or a dotted path), computed over all the step's
groups at once (plus each token's own reward from a distillation teacher, ``algo.teacher``:
:mod:`ardea.trainer.scorers.teacher`), the reference's log-probs when the loss has a KL
term (``algo.ppo.kl_ctl > 0``; scored once per step, whatever ``algo.ppo_epochs`` and
``algo.ppo_mini_batches``), and for a decoupled policy loss (``algo.policy_loss=decoupled_ppo``, the
default when ``rollout.max_staleness > 0``) the proximal log-probs of the policy before the
step's updates.

DAPO (Yu et al. 2025): dynamic sampling (``algo.dynamic_sampling``, the RL step's filter
and refill, :mod:`ardea.rollout.dynamic_sampling`), clip-higher
(``algo.ppo.eps_clip_higher``), token-mean loss (``algo.ppo.loss_agg_mode``) and the
overlong penalty are all options. Dr. GRPO is ``adv_estimator=dr_grpo`` with
``loss_agg_mode=seq-mean-token-sum-norm``.
"""

from __future__ import annotations

from ardea.data import TrajectoryBatch
from ardea.trainer.strategies.base import OnlineStrategy, register_strategy
from ardea.trainer.strategies.grpo import GRPOStrategy
from ardea.trainer.strategies.policy_gradient import needs_proximal


@register_strategy("online_grpo")
class OnlineGRPOStrategy(OnlineStrategy, GRPOStrategy):
    sample_kind = "prompt"
    supports_dynamic_sampling = True
    supports_teacher = True

    def pin(self, batch: TrajectoryBatch, metrics: dict[str, float]) -> TrajectoryBatch:
        """Group advantages over the whole rollout (with a teacher's per-token rewards, the
        RL step pinned them), and the proximal log-probs of a decoupled loss."""
        batch = self.group_advantages(batch)
        if needs_proximal(self):
            batch = batch.pin(proximal_logprobs=self.policy_logprobs(batch))
        return batch

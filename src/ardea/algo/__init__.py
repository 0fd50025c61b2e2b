"""The algorithm core: pure tensor functions for RL post-training (imports only torch).

Notation in every docstring: ``N`` trajectories, ``S`` sequence, ``B`` prompts (or batch
rows of a GAE call), ``G`` group, ``R`` response, ``T`` time steps, ``V`` vocab.

- GAE: :func:`compute_token_level_gae`, :func:`compute_turn_level_gae`, :func:`compute_gae`
- lambda functions: :mod:`ardea.algo.lambda_fn`
- KL estimators: :func:`kl_penalty`; distillation's :func:`topk_forward_kl`
- advantage estimators: :func:`register_advantage`, :func:`get_advantage_estimator`
- the advantage pipeline: :func:`compute_advantages`
- policy losses: PPO / decoupled PPO / GSPO, and the Tinker API's cross-entropy,
  importance sampling, CISPO and DRO, the formulas registered in :data:`POLICY_LOSSES`
  (:func:`register_policy_loss`) reading :class:`PolicyLossInputs`; value, DPO / IPO,
  SimPO / ORPO, cross-entropy, each aggregated by :func:`agg_loss` as an
  :class:`Aggregation` says
"""

from ardea.algo import reinforce_loss  # noqa: F401  (registers its policy losses)
from ardea.algo._checks import trusted_inputs
from ardea.algo._ckernel import c_kernel_available
from ardea.algo.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageOutputs,
    EstimatorInputs,
    dr_grpo_advantages,
    gae_advantages,
    get_advantage_estimator,
    grpo_advantages,
    register_advantage,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from ardea.algo.agg import AGG_MODES, Aggregation, agg_counts, agg_loss, masked_mean
from ardea.algo.cross_entropy import masked_cross_entropy
from ardea.algo.gae import (
    check_turn_ids,
    compute_gae,
    compute_token_level_gae,
    compute_turn_level_gae,
)
from ardea.algo.kl import KL_ESTIMATORS, kl_penalty, topk_forward_kl
from ardea.algo.kto_loss import kto_kl_estimate, kto_logratio_sum, kto_loss
from ardea.algo.lambda_fn import (
    build_lambda_context,
    compute_gae_lambda,
    constant_gae_lambda,
    relative_position_gae_lambda,
    resolve_gae_lambda_fn,
    vapo_length_adaptive_gae,
)
from ardea.algo.mismatch import correction_weights, mismatch_metrics
from ardea.algo.normalize import (
    NORM_MODES,
    group_index,
    group_stats,
    groups_with_spread,
    masked_whiten,
    normalize_scores,
)
from ardea.algo.pipeline import (
    AdvantageInputs,
    compute_advantages,
    next_token_align,
    place_outcome,
)
from ardea.algo.policy_loss import clipped_surrogate, decoupled_ppo, gspo, ppo
from ardea.algo.policy_loss_registry import (
    POLICY_LOSSES,
    POLICY_OPTIONS,
    PolicyLoss,
    PolicyLossInputs,
    get_policy_loss,
    register_policy_loss,
)
from ardea.algo.preference_loss import PairLogps, dpo_loss, ipo_loss
from ardea.algo.reference_free_loss import orpo_loss, simpo_loss
from ardea.algo.reward_model_loss import bradley_terry_loss
from ardea.algo.value_loss import explained_variance, value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "NORM_MODES",
    "POLICY_LOSSES",
    "POLICY_OPTIONS",
    "PolicyLoss",
    "PolicyLossInputs",
    "PairLogps",
    "AdvantageInputs",
    "Aggregation",
    "EstimatorInputs",
    "AdvantageOutputs",
    "agg_counts",
    "agg_loss",
    "bradley_terry_loss",
    "build_lambda_context",
    "c_kernel_available",
    "check_turn_ids",
    "clipped_surrogate",
    "compute_advantages",
    "correction_weights",
    "compute_gae",
    "compute_gae_lambda",
    "compute_token_level_gae",
    "compute_turn_level_gae",
    "constant_gae_lambda",
    "decoupled_ppo",
    "dpo_loss",
    "dr_grpo_advantages",
    "explained_variance",
    "gae_advantages",
    "get_advantage_estimator",
    "get_policy_loss",
    "group_index",
    "group_stats",
    "groups_with_spread",
    "grpo_advantages",
    "gspo",
    "ipo_loss",
    "kl_penalty",
    "topk_forward_kl",
    "kto_kl_estimate",
    "kto_logratio_sum",
    "kto_loss",
    "orpo_loss",
    "simpo_loss",
    "trusted_inputs",
    "masked_cross_entropy",
    "masked_mean",
    "mismatch_metrics",
    "masked_whiten",
    "next_token_align",
    "normalize_scores",
    "place_outcome",
    "ppo",
    "register_advantage",
    "register_policy_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "relative_position_gae_lambda",
    "resolve_gae_lambda_fn",
    "rloo_advantages",
    "value_loss",
    "vapo_length_adaptive_gae",
]

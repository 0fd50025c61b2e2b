"""Configuration of the PPO-family algorithm core: rewards, KL, advantages and losses.

:class:`PPOConfig` is read by :func:`ardea.algo.compute_advantages` and by the policy and
value losses. It is an OmegaConf structured config (``OmegaConf.structured(PPOConfig())``)
and validates itself in ``__post_init__``; a bad value raises :class:`ConfigError` (a
``ValueError``) naming the field and what is allowed. The name tuples below mirror
``ardea.algo`` (config is the lowest layer and imports nothing above it; a test keeps the
two in sync).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ardea.config.fields import check_choices, check_range, option
from ardea.errors import ConfigError

TIMESTEP_UNITS = ("token", "turn")
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")
NORM_MODES = ("none", "batch", "group")
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def _check_gae_lambda(value: Any) -> None:
    if isinstance(value, bool):
        raise ConfigError(
            f"gae_lambda={value!r} must be a number in [0, 1] or a dotted path "
            "'package.module.function', not a bool"
        )
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            module, _, name = value.strip().rpartition(".")
            if not module or not name:
                raise ConfigError(
                    f"gae_lambda={value!r} must be a number in [0, 1] or a dotted path "
                    "'package.module.function', e.g. ardea.algo.lambda_fn.vapo_length_adaptive_gae"
                ) from None
            return
    if not isinstance(value, (int, float)):
        raise ConfigError(f"gae_lambda={value!r} must be a number in [0, 1] or a dotted path")
    if not math.isfinite(value):
        raise ConfigError(
            f"Static gae_lambda must be finite, got gae_lambda={value}; use a number in [0, 1]"
        )
    check_range("gae_lambda", value, low=0.0, high=1.0)


def _check_optional(name: str, value: float | None, **bounds: Any) -> None:
    if value is not None:
        _check_finite(name, value)
        check_range(name, value, **bounds)


def _check_finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name}={value!r} must be a finite number")


@dataclass
class PPOConfig:
    discount: float = option(1.0, "Discount gamma in [0, 1] of the GAE / return recursion.")
    gae_lambda: float | int | str = option(
        1.0,
        "GAE lambda: a number in [0, 1], or a dotted path to a function returning one lambda "
        "per trajectory, e.g. ardea.algo.lambda_fn.vapo_length_adaptive_gae.",
    )
    gae_lambda_kwargs: dict[str, Any] = option(
        help="Keyword arguments of a gae_lambda function, e.g. {alpha: 0.05}; "
        "ignored for a number.",
        factory=dict,
    )
    gae_timestep_unit: str = option(
        "token",
        "GAE time step: 'token' (one step per generated token) or 'turn' (one step per "
        "assistant turn; needs turn_ids in the rollout data).",
        choices=TIMESTEP_UNITS,
    )
    adv_estimator: str | None = option(
        None,
        "Advantage estimator by registered name (gae, grpo, dr_grpo, rloo, reinforce_pp, "
        "reinforce_pp_baseline) or dotted path; null = the strategy's own (gae for the "
        "critic-based pipeline, grpo for grpo).",
    )
    kl_ctl: float = option(
        0.0, "Coefficient of the per-token KL penalty folded into rewards (0 = off)."
    )
    kl_estimator: str = option(
        "k1", "KL estimator for the reward penalty: k1, k2, k3, low_var_kl.", choices=KL_ESTIMATORS
    )
    reward_bias: float = option(0.0, "Added to every outcome reward before scaling.")
    reward_scaling: float = option(1.0, "Outcome rewards are multiplied by this (> 0).")
    reward_clip: float = option(20.0, "Outcome rewards are clipped to [-reward_clip, reward_clip].")
    reward_norm: str = option(
        "none",
        "Normalize outcome rewards (x - mean) / (std + eps): none, batch or group.",
        choices=NORM_MODES,
    )
    adv_norm: str = option(
        "none", "Whiten advantages over trained tokens: none, batch or group.", choices=NORM_MODES
    )
    mask_no_eos_with_zero: bool = option(
        False, "Give truncated trajectories (no EOS) an outcome reward of 0."
    )
    eps_clip: float = option(
        0.2, "PPO ratio clip epsilon (lower side; both sides if eps_clip_higher is null)."
    )
    eps_clip_higher: float | None = option(
        None, "Upper ratio clip epsilon for clip-higher (DAPO uses 0.28); null = eps_clip."
    )
    c_clip: float | None = option(
        None,
        "Dual-clip constant c > 1 bounding the loss of negative advantages (e.g. 3.0); null = off.",
    )
    behav_imp_weight_cap: float | None = option(
        None,
        "Decoupled PPO: drop tokens whose behaviour importance weight pi_prox/pi_behav exceeds "
        "this cap (> 1); null = no cap.",
    )
    value_eps_clip: float | None = option(
        0.2, "Clip the new value to old value +- this in the value loss; null = unclipped."
    )
    loss_agg_mode: str = option(
        "token-mean",
        "Loss aggregation: token-mean, seq-mean-token-sum, seq-mean-token-mean or "
        "seq-mean-token-sum-norm (Dr. GRPO).",
        choices=LOSS_AGG_MODES,
    )

    def __post_init__(self) -> None:
        check_choices(self, "algo.ppo")
        _check_finite("algo.ppo.discount", self.discount)
        check_range("algo.ppo.discount", self.discount, low=0.0, high=1.0)
        _check_gae_lambda(self.gae_lambda)
        if not isinstance(self.gae_lambda_kwargs, dict) and not hasattr(
            self.gae_lambda_kwargs, "keys"
        ):
            raise ConfigError(
                f"algo.ppo.gae_lambda_kwargs={self.gae_lambda_kwargs!r} must be a mapping of "
                "keyword arguments"
            )
        if self.adv_estimator is not None and (
            not isinstance(self.adv_estimator, str) or not self.adv_estimator
        ):
            raise ConfigError(
                "algo.ppo.adv_estimator must name an estimator, e.g. algo.ppo.adv_estimator=gae"
            )
        _check_finite("algo.ppo.kl_ctl", self.kl_ctl)
        check_range("algo.ppo.kl_ctl", self.kl_ctl, low=0.0)
        _check_finite("algo.ppo.reward_bias", self.reward_bias)
        _check_finite("algo.ppo.reward_scaling", self.reward_scaling)
        check_range("algo.ppo.reward_scaling", self.reward_scaling, low=0.0, low_open=True)
        _check_finite("algo.ppo.reward_clip", self.reward_clip)
        check_range("algo.ppo.reward_clip", self.reward_clip, low=0.0, low_open=True)
        _check_finite("algo.ppo.eps_clip", self.eps_clip)
        check_range(
            "algo.ppo.eps_clip", self.eps_clip, low=0.0, high=1.0, low_open=True, high_open=True
        )
        _check_optional("algo.ppo.eps_clip_higher", self.eps_clip_higher, low=0.0, low_open=True)
        _check_optional("algo.ppo.c_clip", self.c_clip, low=1.0, low_open=True)
        _check_optional("algo.ppo.behav_imp_weight_cap", self.behav_imp_weight_cap, low=1.0)
        _check_optional("algo.ppo.value_eps_clip", self.value_eps_clip, low=0.0, low_open=True)

"""The ``algo`` section: which strategy trains and its options (the RL numerics shared by
grpo and ppo are the nested :class:`~ardea.config.PPOConfig`, ``algo.ppo``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ardea.config.fields import check_choices, check_range, option
from ardea.config.mismatch import MismatchConfig
from ardea.config.ppo import PPOConfig
from ardea.config.teacher import TeacherConfig
from ardea.errors import ConfigError


@dataclass
class AlgoConfig:
    name: str = option("sft", "Training strategy by registered name: seq, sft, dpo, grpo, ...")
    label_smoothing: float = option(0.0, "seq/sft: label smoothing of the cross-entropy.")
    beta: float | None = option(
        None,
        "Preference strategies: dpo / online_dpo the inverse temperature of the implicit "
        "reward (default 0.1); simpo the scale of the length-normalised reward (default 2.0); "
        "orpo the weight lambda of the odds-ratio term (default 0.1); kto the inverse "
        "temperature of the implied reward (default 0.1). null = those defaults.",
    )
    kto_desirable_weight: float = option(
        1.0, "kto: weight w_D of the desirable examples' loss (TRL's desirable_weight)."
    )
    kto_undesirable_weight: float = option(
        1.0, "kto: weight w_U of the undesirable examples' loss (TRL's undesirable_weight)."
    )
    simpo_gamma: float = option(
        0.5, "simpo: the margin gamma the chosen reply's reward must beat the rejected one's by."
    )
    dpo_loss: str = option("sigmoid", "dpo: sigmoid (DPO) or ipo.", choices=("sigmoid", "ipo"))
    dpo_reduction: str = option(
        "sum",
        "dpo: sequence log-prob as the sum or the mean of its token log-probs.",
        choices=("sum", "mean"),
    )
    rm_margin: float = option(
        0.0,
        "reward_model: margin the chosen reply's score must beat the rejected one's by, "
        "-log sigmoid(r_chosen - r_rejected - margin) (0 = plain Bradley-Terry).",
    )
    rm_center_coef: float = option(
        0.0,
        "reward_model: weight of (r_chosen + r_rejected)^2, which keeps scores centred on 0 "
        "(TRL's center_rewards_coefficient; 0 = off).",
    )
    moe_aux_loss_coef: float = option(
        0.01, "Weight of a mixture-of-experts model's load-balancing loss (0 = off)."
    )
    moe_routing_replay: bool = option(
        False,
        "Online RL with an MoE policy (R3, routing replay): the engine records the experts "
        "every token was routed to and every training forward of the rollout (policy, "
        "proximal, reference) routes it to the same ones, gate weights from the trainer's "
        "router; false: each forward routes itself.",
    )
    ppo_epochs: int = option(
        1,
        "Online RL: passes over each rollout batch; advantages are computed once per rollout "
        "and reused by every pass.",
    )
    ppo_mini_batches: int = option(
        1,
        "Online RL: optimizer steps per pass; the rollout's trajectories are shuffled and split "
        "into this many mini-batches.",
    )
    policy_loss: str | None = option(
        None,
        "Online RL and grpo: the policy loss by registered name: ppo (clipped surrogate, "
        "clip-higher and dual-clip through algo.ppo), decoupled_ppo (ratio against the policy "
        "before the step's updates, behaviour weight capped by algo.ppo.behav_imp_weight_cap), "
        "gspo (sequence-level ratio; set algo.ppo.eps_clip=3e-4 eps_clip_higher=4e-4), cispo "
        "(REINFORCE weighted by the ratio clipped to algo.ppo.eps_clip / eps_clip_higher), "
        "importance_sampling (unclipped ratio), cross_entropy (plain REINFORCE, -A log pi); dro "
        "serves the Tinker API only (its beta is no algo.ppo option); or the dotted path of "
        "your own fn(inputs, **options), registered with ardea.algo.register_policy_loss or "
        "plain; null = decoupled_ppo when rollout.max_staleness > 0, else ppo.",
    )
    dynamic_sampling: bool = option(
        False,
        "online_grpo (DAPO): drop groups whose rewards are all equal and refill the batch with "
        "fresh prompts.",
    )
    dynamic_sampling_max_rounds: int = option(
        3, "online_grpo: most extra generation rounds per step when refilling dropped groups."
    )
    dynamic_sampling_max_refill: int = option(
        1,
        "online_grpo: most prompts one refill round generates, in multiples of "
        "trainer.batch_size; a round asks for the missing groups divided by the share of "
        "groups kept so far in the step, up to this cap (1 = one batch of prompts per round).",
    )
    critic_path: str | None = option(
        None,
        "online_ppo: initial critic, a directory saved by ValueModel.save_pretrained (e.g. a "
        "checkpoint's critic/); null warm-starts the critic from the policy with a zero head.",
    )
    critic_lr: float = option(1e-4, "online_ppo: peak learning rate of the critic (AdamW).")
    critic_warmup_steps: int = option(
        0, "online_ppo: linear warm-up steps of the critic's learning rate (same schedule kind)."
    )
    critic_max_grad_norm: float = option(
        1.0, "online_ppo: clip the critic's gradient norm to this (0 = off)."
    )
    vf_coef: float = option(
        0.5,
        "online_ppo: weight of the value loss in the summed loss (the critic has its own "
        "optimizer, so this scales its gradient).",
    )
    mismatch: MismatchConfig = option(
        help="Online RL: correction of the train-inference mismatch (TIS / MIS).",
        factory=MismatchConfig,
    )
    teacher: TeacherConfig = option(
        help="Online RL: on-policy distillation, a teacher's per-token reward on the "
        "student's own samples.",
        factory=TeacherConfig,
    )
    ppo: PPOConfig = option(
        help="RL numerics shared by grpo/ppo: clipping, KL, advantages, loss aggregation.",
        factory=PPOConfig,
    )

    def __post_init__(self) -> None:
        check_choices(self, "algo")
        if not self.name:
            raise ConfigError("algo.name must name a strategy, e.g. algo.name=sft")
        if self.policy_loss is not None and (
            not isinstance(self.policy_loss, str) or not self.policy_loss
        ):
            raise ConfigError(
                f"algo.policy_loss={self.policy_loss!r} must name a policy loss "
                "(e.g. ppo, decoupled_ppo, gspo) or be null"
            )
        check_range("algo.label_smoothing", self.label_smoothing, low=0.0, high=1.0, high_open=True)
        if self.beta is not None:
            check_range("algo.beta", self.beta, low=0.0, low_open=True)
        if self.name != "simpo" and self.simpo_gamma != 0.5:
            raise ConfigError(
                f"algo.simpo_gamma={self.simpo_gamma} is an option of algo.name=simpo; "
                f"algo.name={self.name} does not use it: unset it"
            )
        if not math.isfinite(self.simpo_gamma):
            raise ConfigError(f"algo.simpo_gamma={self.simpo_gamma!r} must be a finite number")
        if self.name in ("simpo", "orpo", "kto") and (
            self.dpo_loss != "sigmoid" or self.dpo_reduction != "sum"
        ):
            raise ConfigError(
                f"algo.dpo_loss / algo.dpo_reduction are options of dpo; algo.name={self.name} "
                "has its own loss: unset them"
            )
        for name in ("kto_desirable_weight", "kto_undesirable_weight"):
            check_range(f"algo.{name}", getattr(self, name), low=0.0, low_open=True)
            if self.name != "kto" and getattr(self, name) != 1.0:
                raise ConfigError(
                    f"algo.{name}={getattr(self, name)} is an option of algo.name=kto; "
                    f"algo.name={self.name} does not use it: unset it"
                )
        if self.name != "reward_model" and (self.rm_margin or self.rm_center_coef):
            raise ConfigError(
                f"algo.rm_margin / algo.rm_center_coef are options of algo.name=reward_model; "
                f"algo.name={self.name} does not use them: unset them"
            )
        if not math.isfinite(self.rm_margin):
            raise ConfigError(f"algo.rm_margin={self.rm_margin!r} must be a finite number")
        check_range("algo.rm_center_coef", self.rm_center_coef, low=0.0)
        check_range("algo.moe_aux_loss_coef", self.moe_aux_loss_coef, low=0.0)
        check_range("algo.ppo_epochs", self.ppo_epochs, low=1)
        check_range("algo.ppo_mini_batches", self.ppo_mini_batches, low=1)
        check_range("algo.dynamic_sampling_max_rounds", self.dynamic_sampling_max_rounds, low=0)
        check_range("algo.dynamic_sampling_max_refill", self.dynamic_sampling_max_refill, low=1)
        check_range("algo.critic_lr", self.critic_lr, low=0.0, low_open=True)
        check_range("algo.critic_warmup_steps", self.critic_warmup_steps, low=0)
        check_range("algo.critic_max_grad_norm", self.critic_max_grad_norm, low=0.0)
        check_range("algo.vf_coef", self.vf_coef, low=0.0)

"""Critic-based online PPO (``online_ppo``): GAE over a learned value model.

Reference: Schulman et al. 2017 (PPO) with GAE (Schulman et al. 2016) as used for language
models by Ouyang et al. 2022 (InstructGPT: per-token KL to a frozen reference folded into
the rewards); the clipped value loss of OpenAI baselines' ``ppo2``; seed 001's PPO strategy
for the roles below. Every formula is imported from :mod:`ardea.algo`.

Roles:

- the policy, trained by the loop's optimizer;
- the behaviour policy: the engine's per-token log-probs recorded at rollout (required);
- the critic: a :class:`~ardea.model.ValueModel`, the backbone of a fresh copy of the
  initial policy (``make_reference()``) plus a zero-initialised scalar head, or
  ``algo.critic_path``, wrapped for data parallelism like the policy; a trained component
  (:mod:`ardea.trainer.components`) with its own AdamW (``algo.critic_lr``), gradient
  clipping (``algo.critic_max_grad_norm``) and learning-rate schedule
  (``trainer.lr_schedule`` with ``algo.critic_warmup_steps``), stepped by the updater right
  after every policy optimizer step; it never generates, so it is not part of a policy
  version. With LoRA (``model.lora_r > 0``) the critic gets adapters of the same rank on
  the same modules of its own backbone copy and trains them and its value head only
  (:func:`ardea.model.lora.lora_critic`): its optimizer state stays as small as the
  policy's. The frozen base weights are a second copy, not shared with the policy: sharing
  one module between the policy and the critic would mean switching adapters between their
  forwards, and each is wrapped for data parallelism on its own;
- the reference: a frozen copy of the initial policy, built only when
  ``algo.ppo.kl_ctl > 0``.

Pinned on the whole rollout before any update (:meth:`OnlinePPOStrategy.pin`):
the critic's values ``V`` at rollout time, then :func:`ardea.algo.compute_advantages` with
``algo.ppo``: outcome reward at the last completion token, ``-kl_ctl * KL(behaviour ||
reference)`` on every completion token (``kl_estimator``), GAE at the token or turn level
(``gae_timestep_unit``) with a static or per-trajectory λ (``gae_lambda`` a number or a
dotted path such as ``ardea.algo.lambda_fn.vapo_length_adaptive_gae``), bootstrapping from
``V`` at the last token of truncated completions. Every pass over the rollout (``algo.
ppo_epochs`` × ``algo.ppo_mini_batches``) optimizes these same advantages and returns.

Loss of a micro-batch (all next-token aligned, aggregated by ``algo.ppo.loss_agg_mode``
over the counts of the whole optimizer step):
``policy_loss + vf_coef * value_loss`` with the policy loss of ``algo.policy_loss`` (the
clipped surrogate with clip-higher and dual-clip; decoupled PPO against the proximal
log-probs pinned before the updates, the default for stale rollouts) and
``value_loss = 0.5 * max((V' - R)^2, (clip(V', V ± value_eps_clip) - R)^2)``.

Metrics besides GRPO's policy metrics: the value loss's ``loss/value`` and
``loss/value_clip_frac``; per rollout ``critic/explained_variance``
(``1 - Var[R - V] / Var[R]`` over completion tokens, with the rollout-time values),
``critic/value_mean``, ``critic/return_mean``, ``critic/advantage_std``, ``rollout/kl`` (mean
per-token KL estimate between behaviour and reference, with a reference); per update
``critic/grad_norm`` and ``critic/lr`` (the component's metrics).

Checkpoints hold the critic in ``critic/`` (Hugging Face token-classification format; a
LoRA critic merged, with its adapters and head alone in ``critic/trainable.safetensors``,
which a resume loads) and its optimizer and scheduler in ``trainer_state.pt``; a resume from a checkpoint without them
is an error, never a silently fresh critic.

Deviations from seed 001: advantages are not whitened unless ``algo.ppo.adv_norm`` says so;
the value loss has the 0.5 factor (seed: none; scale ``vf_coef``); KL uses the configured
estimator (seed: the log-ratio, which is ``k1``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from ardea.algo import (
    compute_advantages,
    explained_variance,
    kl_penalty,
    masked_mean,
    value_loss,
)
from ardea.data import TrajectoryBatch
from ardea.errors import ConfigError
from ardea.model import ValueModel
from ardea.model.lora import lora_critic, merged_critic
from ardea.trainer.components import TrainedComponent
from ardea.trainer.distributed import unwrap
from ardea.trainer.moe_terms import MoETerms
from ardea.trainer.scorers.teacher import forward_kl_term
from ardea.trainer.state_dicts import load_full_state_dict
from ardea.trainer.strategies import policy_gradient
from ardea.trainer.strategies.base import OnlineStrategy, register_strategy

CRITIC_DIR = "critic"
CRITIC_TRAINED = "trainable.safetensors"  # a LoRA critic's adapters and value head


@register_strategy("online_ppo")
class OnlinePPOStrategy(OnlineStrategy):
    """PPO with a learned critic on fresh rollouts (module docstring)."""

    supports_teacher = True

    @classmethod
    def wants_reference(cls, config: Any) -> bool:
        """A frozen reference only for the KL term (``algo.ppo.kl_ctl > 0``)."""
        return bool(config.algo.ppo.kl_ctl)

    def __init__(self, policy: nn.Module, config: Any, **kwargs: Any) -> None:
        super().__init__(policy, config, **kwargs)
        algo = config.algo
        self.ppo = algo.ppo
        self.loss_name = policy_gradient.policy_loss_name(config, online=True)
        self.policy_loss = policy_gradient.resolve_policy_loss(self.loss_name, self.ppo)
        policy_gradient.check_mismatch(algo.mismatch, self.policy_loss, online=True)
        self.critic = self._build_critic(algo.critic_path)
        # the critic trains with its own AdamW, schedule and clipping; saved in critic/
        self.critic_component = TrainedComponent.build(
            "critic",
            self.critic,
            config.trainer,
            lr=algo.critic_lr,
            warmup_steps=algo.critic_warmup_steps,
            max_grad_norm=algo.critic_max_grad_norm,
            checkpoint_dir=CRITIC_DIR,
            save=self._save_critic,
            load=self._load_critic,
        )
        self.moe = MoETerms(policy, algo.moe_aux_loss_coef)

    def _build_critic(self, path: str | None) -> nn.Module:
        device = next(self.policy.parameters()).device
        if path is None:
            critic = ValueModel.from_policy(self.initial_policy())
        else:
            critic = ValueModel.from_pretrained(path, device=device)
        critic.requires_grad_(True)
        m = self.config.model
        if m.lora_r:
            critic = lora_critic(critic, r=m.lora_r, alpha=m.lora_alpha, dropout=m.lora_dropout,
                                 target_modules=list(m.lora_target_modules))  # fmt: skip
        return self.wrap(critic.to(device).train(), trainable=True)

    def trained_components(self) -> list[TrainedComponent]:
        return [self.critic_component]

    def _save_critic(self, path: Path, state: dict[str, Tensor]) -> None:
        """The critic as a plain token-classifier (merged, for LoRA) and, for LoRA, its
        trained tensors alone (what a resume loads: merging is not undone exactly)."""
        critic = unwrap(self.critic)
        if not self.config.model.lora_r:
            critic.save_pretrained(path, state_dict=state)
            return
        merged_critic(critic, state).save_pretrained(path)
        trained = {n for n, p in critic.named_parameters() if p.requires_grad}
        tensors = {k: v.detach().contiguous() for k, v in state.items() if k in trained}
        save_file(tensors, str(Path(path) / CRITIC_TRAINED))

    def _load_critic(self, path: Path) -> None:
        if self.config.model.lora_r:
            file = Path(path) / CRITIC_TRAINED
            if not file.is_file():
                raise ConfigError(f"model.lora_r > 0 but the checkpoint's critic has no {file}")
            state = load_file(str(file))
            trained = {n for n, p in unwrap(self.critic).named_parameters() if p.requires_grad}
            _, unexpected = load_full_state_dict(self.critic, state)
            if unexpected or trained - set(state):
                raise ConfigError(
                    f"{file} does not fit this LoRA critic (model.lora_r / "
                    f"lora_target_modules changed?): missing {sorted(trained - set(state))[:3]}, "
                    f"unexpected {list(unexpected)[:3]}"
                )
            return
        device = next(self.critic.parameters()).device
        saved = ValueModel.from_pretrained(path, device=device)
        load_full_state_dict(self.critic, saved.state_dict())

    # --------------------------------------------------------------- rollout
    @torch.no_grad()
    def pin(self, batch: TrajectoryBatch, metrics: dict[str, float]) -> TrajectoryBatch:
        """Critic values and GAE (with the reference's KL and a teacher's per-token
        rewards, which the RL step pinned), pinned on the rollout."""
        self.critic.eval()
        # (N, S): V after 0..t; under torchrun each rank computes its share of the rows
        values = self.rows.map(batch, lambda rows: self.critic(rows.input_ids, rows.attention_mask))
        self.critic.train()
        out = compute_advantages(batch.advantage_inputs(values=values), self.ppo)
        batch = batch.pin(advantages=out.advantages, returns=out.returns, old_values=values)
        if policy_gradient.needs_proximal(self):
            batch = batch.pin(proximal_logprobs=self.policy_logprobs(batch))
        metrics.update(self._rollout_metrics(batch))
        return batch

    def _rollout_metrics(self, batch: TrajectoryBatch) -> dict[str, float]:
        mask = batch.action_mask
        values, returns, adv = batch.old_values, batch.returns, batch.advantages
        mean_adv = masked_mean(adv, mask)
        out = {
            "critic/explained_variance": float(explained_variance(values, returns, mask)),
            "critic/value_mean": float(masked_mean(values, mask)),
            "critic/return_mean": float(masked_mean(returns, mask)),
            "critic/advantage_std": float(masked_mean((adv - mean_adv).square(), mask).sqrt()),
        }
        if batch.ref_logprobs is not None:
            kl = kl_penalty(batch.behaviour_logprobs, batch.ref_logprobs, self.ppo.kl_estimator)
            out["rollout/kl"] = float(masked_mean(kl, mask))
        return out

    # ------------------------------------------------------------------ loss
    def step_counts(self, micro_batches: list[TrajectoryBatch]) -> dict[str, float]:
        return policy_gradient.rl_step_counts(micro_batches, self.moe)

    def loss(
        self, batch: TrajectoryBatch, step_counts: dict[str, float]
    ) -> tuple[Tensor, dict[str, Tensor | float]]:
        mask = batch.action_mask  # (N, S) bool
        out = policy_gradient.policy_forward(self, batch)
        agg = policy_gradient.step_aggregation(step_counts, self.ppo.loss_agg_mode)
        policy_loss, metrics = policy_gradient.policy_objective(
            self.ppo,
            self.policy_loss,
            out.logprobs,
            batch,
            agg,
            old=policy_gradient.ratio_reference(batch),
            mismatch=self.config.algo.mismatch,
            first_update=step_counts.get("update", 0.0) == 0.0,
        )
        values = self.critic(batch.input_ids, batch.attention_mask)  # (N, S) with gradient
        critic_loss, parts = value_loss(
            values,
            batch.old_values,
            batch.returns.to(values.dtype),
            mask,
            value_eps_clip=self.ppo.value_eps_clip,
            agg=agg,
        )
        metrics["train/entropy"] = masked_mean(out.entropy, mask, agg.tokens).detach()
        metrics |= {name: value.detach() for name, value in parts.items()}  # loss/value, ...
        loss = policy_loss + self.config.algo.vf_coef * critic_loss
        loss = loss + forward_kl_term(self.config, batch, out.logprobs_at, agg, metrics)
        loss, moe_metrics = self.moe.add(loss, out, batch, step_counts)
        return loss, {"train/loss": loss.detach(), **metrics, **moe_metrics}

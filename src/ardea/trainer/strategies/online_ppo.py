"""Critic-based online PPO (``online_ppo``): GAE over a learned value model.

Reference: Schulman et al. 2017 (PPO) with GAE (Schulman et al. 2016) as used for language
models by Ouyang et al. 2022 (InstructGPT: per-token KL to a frozen reference folded into
the rewards); the clipped value loss of OpenAI baselines' ``ppo2``; seed 001's PPO strategy
for the roles below. Every formula is imported from :mod:`ardea.algo`.

Roles:

- the policy, trained by the loop's optimizer;
- the behaviour policy: the engine's per-token log-probs recorded at rollout (required);
- the critic: a :class:`~ardea.model.ValueModel`, the policy's backbone (deep copy) plus a
  zero-initialised scalar head, or ``algo.critic_path``; it has its own AdamW
  (``algo.critic_lr``), gradient clipping (``algo.critic_max_grad_norm``) and learning-rate
  schedule (``trainer.lr_schedule`` with ``algo.critic_warmup_steps``), stepped right after
  every policy optimizer step; it never generates, so it is not part of a policy version;
- the reference: a frozen copy of the initial policy, built only when
  ``algo.ppo.kl_ctl > 0``.

Pinned on the whole rollout before any update (:meth:`OnlinePPOStrategy.prepare_rollout`):
the critic's values ``V`` at rollout time, then :func:`ardea.algo.compute_advantages` with
``algo.ppo``: outcome reward at the last completion token, ``-kl_ctl * KL(behaviour ||
reference)`` on every completion token (``kl_estimator``), GAE at the token or turn level
(``gae_timestep_unit``) with a static or per-trajectory λ (``gae_lambda`` a number or a
dotted path such as ``ardea.algo.lambda_fn.vapo_length_adaptive_gae``), bootstrapping from
``V`` at the last token of truncated completions. Every pass over the rollout (``algo.
ppo_epochs`` × ``algo.ppo_mini_batches``) optimizes these same advantages and returns.

Loss of a micro-batch (all next-token aligned, aggregated by ``algo.ppo.loss_agg_mode``
over the counts of the whole optimizer step):
``policy_loss + vf_coef * value_loss`` with the clipped surrogate (clip-higher, dual-clip;
decoupled PPO against recomputed proximal log-probs for stale rollouts) and
``value_loss = 0.5 * max((V' - R)^2, (clip(V', V ± value_eps_clip) - R)^2)``.

Metrics besides GRPO's ``train/*`` policy metrics: ``train/value_loss``,
``train/value_clip_fraction``; per rollout ``critic/explained_variance``
(``1 - Var[R - V] / Var[R]`` over completion tokens, with the rollout-time values),
``critic/value_mean``, ``critic/return_mean``, ``critic/advantage_std``, ``rollout/kl`` (mean
per-token KL estimate between behaviour and reference, with a reference); per step
``critic/grad_norm`` and ``critic/lr``.

Checkpoints hold the critic in ``critic/`` (Hugging Face token-classification format) and
its optimizer and scheduler in ``trainer_state.pt``; a resume from a checkpoint without them
is an error, never a silently fresh critic.

Deviations from seed 001: advantages are not whitened unless ``algo.ppo.adv_norm`` says so;
the value loss has the 0.5 factor (seed: none; scale ``vf_coef``); KL uses the configured
estimator (seed: the log-ratio, which is ``k1``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ardea.algo import (
    compute_advantages,
    explained_variance,
    kl_penalty,
    masked_mean,
    next_token_align,
    value_loss,
)
from ardea.data import Example
from ardea.errors import ArdeaError, ConfigError
from ardea.model import ValueModel, sequence_logprobs
from ardea.trainer.schedule import build_adamw
from ardea.trainer.strategies.base import Strategy, register_strategy
from ardea.trainer.strategies.dpo import frozen_reference
from ardea.trainer.strategies.grpo import (
    check_behaviour_logprobs,
    policy_objective,
    rl_step_counts,
)
from ardea.trainer.strategies.moe import MoETerms
from ardea.trainer.strategies.online import OnlineRollouts

CRITIC_DIR = "critic"


def token_aligned(next_aligned: Tensor) -> Tensor:
    """Next-token aligned ``(N, S)`` → token aligned: ``out[:, t + 1] = x[:, t]``, column 0
    is 0 (the inverse of :func:`ardea.algo.next_token_align`)."""
    out = torch.zeros_like(next_aligned)
    out[:, 1:] = next_aligned[:, :-1]
    return out


@register_strategy("online_ppo")
class OnlinePPOStrategy(OnlineRollouts, Strategy):
    """PPO with a learned critic on fresh rollouts (module docstring)."""

    sample_kind = "prompt"

    def __init__(self, policy: nn.Module, config: Any, **kwargs: Any) -> None:
        super().__init__(policy, config, **kwargs)
        self._init_online()
        algo = config.algo
        if config.model.lora_r:
            raise ConfigError(
                "online_ppo does not support LoRA yet (model.lora_r > 0): the critic would be "
                "a copy of the adapted policy; train all weights (model.lora_r=0)"
            )
        self.ppo = algo.ppo
        self.critic = self._build_critic(algo.critic_path)
        self.critic_parameters = [p for p in self.critic.parameters() if p.requires_grad]
        self.critic_optimizer, self.critic_scheduler = build_adamw(
            self.critic_parameters,
            config.trainer,
            lr=algo.critic_lr,
            warmup_steps=algo.critic_warmup_steps,
        )
        kl = float(self.ppo.kl_ctl)
        self.reference = frozen_reference(self.make_reference, "online_ppo") if kl else None
        self.moe = MoETerms(policy, algo.moe_aux_loss_coef)
        self._critic_norms: list[float] = []

    def _build_critic(self, path: str | None) -> ValueModel:
        device = next(self.policy.parameters()).device
        if path is None:
            critic = ValueModel.from_policy(self.policy)
        else:
            critic = ValueModel.from_pretrained(path, device=device)
        return critic.to(device).train().requires_grad_(True)

    def collate(self, samples: Sequence[Example]) -> dict[str, Tensor]:
        raise TypeError("online_ppo builds its batches from rollouts (plan_step)")

    def frozen_modules(self) -> list[nn.Module]:
        return [self.reference] if self.reference is not None else []

    # --------------------------------------------------------------- rollout
    @torch.no_grad()
    def prepare_rollout(
        self, batch: dict[str, Tensor], *, step: int, metrics: dict[str, float]
    ) -> dict[str, Tensor]:
        """Critic values, reference log-probs and GAE, pinned on the rollout."""
        if "logprobs" not in batch:
            raise ValueError(
                "online_ppo needs the rollout's behaviour log-probs (batch['logprobs'], "
                "token-aligned (N, S)); the engine records them with every completion"
            )
        check_behaviour_logprobs(batch["logprobs"], batch["input_ids"])
        ids, attn = batch["input_ids"], batch["attention_mask"]
        self.critic.eval()
        values = self.critic(ids, attn)  # (N, S), next-token aligned: V after tokens 0..t
        self.critic.train()
        inputs = {**batch, "values": values}
        if self.reference is not None:
            ref = sequence_logprobs(
                self.reference,
                ids,
                attn,
                chunk_size=self.config.model.logprob_chunk_size,
                temperature=self.temperature,
            ).logprobs  # (N, S) next-token aligned
            inputs["ref_logp"] = token_aligned(ref)
        pinned = compute_advantages(inputs, self.ppo)
        pinned["old_values"] = values
        if self.decoupled:
            pinned["proximal_logprobs"] = self.proximal_logprobs(batch)
        metrics.update(self._rollout_metrics(pinned, inputs))
        return pinned

    def _rollout_metrics(self, pinned: dict[str, Tensor], inputs: dict) -> dict[str, float]:
        mask = pinned["next_loss_mask"]
        values, returns, adv = pinned["old_values"], pinned["returns"], pinned["advantages"]
        mean_adv = masked_mean(adv, mask)
        out = {
            "critic/explained_variance": float(explained_variance(values, returns, mask)),
            "critic/value_mean": float(masked_mean(values, mask)),
            "critic/return_mean": float(masked_mean(returns, mask)),
            "critic/advantage_std": float(masked_mean((adv - mean_adv).square(), mask).sqrt()),
        }
        if "ref_logp" in inputs:
            reference = next_token_align(inputs["ref_logp"])
            kl = kl_penalty(pinned["next_logprobs"], reference, self.ppo.kl_estimator)
            out["rollout/kl"] = float(masked_mean(kl, mask))
        return out

    # ------------------------------------------------------------------ loss
    def step_counts(self, micro_batches: list[dict[str, Tensor]]) -> dict[str, float]:
        return rl_step_counts(micro_batches, self.moe)

    def loss(
        self, batch: dict[str, Tensor], step_counts: dict[str, float]
    ) -> tuple[Tensor, dict[str, float]]:
        mask = batch["next_loss_mask"]  # (N, S) bool
        ids, attn = batch["input_ids"], batch["attention_mask"]
        out = sequence_logprobs(
            self.policy,
            ids,
            attn,
            chunk_size=self.config.model.logprob_chunk_size,
            with_entropy=True,
            temperature=self.temperature,
        )
        counts = dict(
            global_tokens=step_counts["tokens"],
            global_seqs=step_counts["seqs"],
            horizon=int(step_counts["horizon"]),
        )
        policy_loss, metrics = policy_objective(
            self.ppo, out.logprobs, batch["next_logprobs"].to(out.logprobs.dtype),
            batch["advantages"], mask, counts, proximal=batch.get("proximal_logprobs"),
        )  # fmt: skip
        values = self.critic(ids, attn)  # (N, S) with gradient
        critic_loss, parts = value_loss(
            values,
            batch["old_values"],
            batch["returns"].to(values.dtype),
            mask,
            value_eps_clip=self.ppo.value_eps_clip,
            loss_agg_mode=self.ppo.loss_agg_mode,
            **counts,
        )
        tokens = step_counts["tokens"]
        metrics["train/entropy"] = float(masked_mean(out.entropy, mask, global_tokens=tokens))
        metrics["train/value_loss"] = float(critic_loss.detach())
        metrics["train/value_clip_fraction"] = float(parts["loss/value_clip_frac"])
        loss = policy_loss + self.config.algo.vf_coef * critic_loss
        loss, moe_metrics = self.moe.add(
            loss, out, input_ids=ids, attention_mask=attn, step_counts=step_counts
        )
        return loss, {"train/loss": float(loss.detach()), **metrics, **moe_metrics}

    # ---------------------------------------------------------------- critic
    def after_optimizer_step(self) -> None:
        """The critic's own step right after the policy's: clip, step, clear."""
        max_norm = self.config.algo.critic_max_grad_norm or float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(self.critic_parameters, max_norm))
        self._critic_norms.append(norm)
        if math.isfinite(norm):
            self.critic_optimizer.step()
        self.critic_optimizer.zero_grad(set_to_none=True)

    def skip_optimizer_step(self) -> None:
        self.critic_optimizer.zero_grad(set_to_none=True)

    def after_train_step(self) -> None:
        self.critic_scheduler.step()
        super().after_train_step()

    def step_metrics(self) -> dict[str, float]:
        metrics = super().step_metrics()
        norms, self._critic_norms = self._critic_norms, []
        if norms:
            metrics["critic/grad_norm"] = sum(norms) / len(norms)
        metrics["critic/lr"] = self.critic_scheduler.get_last_lr()[0]
        return metrics

    # ----------------------------------------------------------- checkpoints
    def save_modules(self, directory: Path) -> None:
        self.critic.save_pretrained(Path(directory) / CRITIC_DIR)

    def load_modules(self, directory: Path) -> None:
        path = Path(directory) / CRITIC_DIR
        if not (path / "config.json").is_file():
            raise ArdeaError(
                f"checkpoint {directory} has no {CRITIC_DIR}/ (the critic of online_ppo); "
                "it cannot resume this run without its critic. Resume from a checkpoint of an "
                "online_ppo run, or start a new run (trainer.resume=never)."
            )
        device = next(self.critic.parameters()).device
        saved = ValueModel.from_pretrained(path, device=device)
        self.critic.load_state_dict(saved.state_dict())

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "critic_scheduler": self.critic_scheduler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [k for k in ("critic_optimizer", "critic_scheduler") if k not in state]
        if missing:
            raise ArdeaError(
                f"the checkpoint's trainer state has no {', '.join(missing)} for the critic "
                "of online_ppo; it was not written by an online_ppo run"
            )
        super().load_state_dict(state)
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.critic_scheduler.load_state_dict(state["critic_scheduler"])

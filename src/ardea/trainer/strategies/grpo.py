"""Offline GRPO (``grpo``): group-relative advantages, clipped surrogate, KL to a reference.

Reference: Shao et al. 2024 (DeepSeekMath, GRPO): per prompt, G scored completions; each
completion's advantage is its group-normalized reward ``(R_i - mean_g) / (std_g + 1e-8)``,
broadcast over its completion tokens; the loss is PPO's clipped surrogate plus
``kl_ctl * KL(pi || pi_ref)`` as a loss term (not a reward penalty). Every formula lives in
:mod:`ardea.algo`: advantages from :func:`ardea.algo.compute_advantages` with the registered
estimator ``algo.ppo.adv_estimator``, the surrogate from :func:`ardea.algo.ppo_policy_loss`
(``eps_clip``, ``eps_clip_higher``, ``c_clip``, ``loss_agg_mode``), the KL from
:func:`ardea.algo.kl_penalty` (``kl_estimator``), aggregated like the surrogate.

Three policies (seed 002's roles):

- the policy being trained;
- the old policy of the ratio: the batch's behaviour log-probs ``logprobs`` when present
  (validated: same shape as ``input_ids``, all finite), else a frozen copy of the policy
  taken at construction and re-synced from the policy after every optimizer step
  (:meth:`GRPOStrategy.after_optimizer_step`), so the ratio is 1 throughout a step;
- the reference for the KL term: ``make_reference()`` (the initial policy), frozen; built
  only when ``algo.ppo.kl_ctl > 0``.

Deviations: ``algo.ppo.adv_estimator`` null means ``grpo``; ``gae`` needs a critic that this
strategy does not have and is a config error; every other registered estimator or dotted
path is used as configured. KL is not folded into
rewards here (``kl_ctl`` weights the loss term). Advantages are computed per micro-batch:
exact for the group estimators because a micro-batch holds whole groups (one ``GroupSample``
is a prompt with all its completions), while batch-wide normalizations (``reward_norm`` /
``adv_norm = batch``, ``reinforce_pp``) see the micro-batch. ``seq-mean-token-sum-norm``
uses the step's longest row as its horizon.

Batch (``collate_groups``): ``input_ids``, ``attention_mask``, ``loss_mask`` (token-aligned,
1 on completion tokens) ``[N, S]``, ``rewards [N]``, ``group_ids [N]``, optionally
``logprobs [N, S]`` (token-aligned behaviour log-probs) and ``no_eos [N]``.

Metrics (token means over the step's trained tokens unless noted; sums over micro-batches
give the step value): ``train/loss``, ``train/policy_loss``, ``train/kl`` (with a reference),
``train/clip_fraction``, ``train/approx_kl`` (k3 estimate of KL(old || pi)),
``train/entropy``, ``train/advantage_mean``, ``train/reward_mean`` and ``train/reward_std``
(population std; both over the step's completions), and the MoE metrics.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor, nn

from ardea import data
from ardea.algo import (
    agg_loss,
    compute_advantages,
    decoupled_ppo_policy_loss,
    kl_penalty,
    masked_mean,
    next_token_align,
    ppo_policy_loss,
)
from ardea.config.ppo import PPOConfig
from ardea.errors import ConfigError
from ardea.model import sequence_logprobs
from ardea.trainer.strategies.base import Strategy, register_strategy
from ardea.trainer.strategies.dpo import freeze, frozen_reference
from ardea.trainer.strategies.moe import MoETerms

CRITIC_ESTIMATORS = ("gae",)  # estimators that need a critic


def check_behaviour_logprobs(logprobs: Tensor, input_ids: Tensor) -> None:
    """Reject behaviour log-probs that do not describe ``input_ids`` token by token."""
    if logprobs.shape != input_ids.shape:
        raise ValueError(
            f"behaviour logprobs shape {tuple(logprobs.shape)} must equal input_ids shape "
            f"{tuple(input_ids.shape)} (token-aligned: logprobs[:, t] = log p(input_ids[:, t]))"
        )
    if not logprobs.is_floating_point():
        raise ValueError(f"behaviour logprobs must be floating point, got {logprobs.dtype}")
    if not bool(torch.isfinite(logprobs).all()):
        raise ValueError(
            "behaviour logprobs must contain only finite values (use 0 outside completions)"
        )


def advantage_config(ppo: Any) -> SimpleNamespace:
    """``algo.ppo`` as the advantage pipeline should see it here: no KL folded into rewards
    (GRPO's KL is a loss term) and a critic-free estimator."""
    fields = {f.name: getattr(ppo, f.name) for f in dataclasses.fields(PPOConfig)}
    fields["kl_ctl"] = 0.0
    estimator = ppo.adv_estimator or "grpo"
    if estimator in CRITIC_ESTIMATORS:
        raise ConfigError(
            f"algo.ppo.adv_estimator={estimator!r} needs a critic, which grpo does not train; "
            "use grpo, dr_grpo, rloo, reinforce_pp or reinforce_pp_baseline (or null)"
        )
    fields["adv_estimator"] = estimator
    return SimpleNamespace(**fields)


def rl_step_counts(micro_batches: list[dict[str, Tensor]], moe: MoETerms) -> dict[str, float]:
    """The normalisers of one optimizer step over its micro-batches: completion ``tokens`` and
    ``seqs`` (next-token aligned), ``rows``, the ``horizon`` (longest row), the population
    ``reward_std`` of the step's completions, and the MoE routed tokens."""
    masks = [next_token_align(b["loss_mask"].bool(), False) for b in micro_batches]
    rewards = torch.cat([b["rewards"].detach().float().reshape(-1) for b in micro_batches])
    counts = {
        "tokens": float(sum(m.sum() for m in masks)),
        "seqs": float(sum(m.any(dim=-1).sum() for m in masks)),
        "rows": float(rewards.numel()),
        "horizon": float(max(m.shape[-1] for m in masks)),
        "reward_std": float(rewards.std(unbiased=False)) if rewards.numel() else 0.0,
    }
    forwards = [(b["input_ids"], b.get("attention_mask")) for b in micro_batches]
    return counts | moe.step_counts(forwards)


def policy_objective(
    ppo: Any,
    logprobs: Tensor,
    behaviour: Tensor,
    advantages: Tensor,
    mask: Tensor,
    counts: dict[str, Any],
    *,
    proximal: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The clipped surrogate of ``algo.ppo`` and its ``train/*`` metrics; all ``(N, S)``
    next-token aligned. With ``proximal`` log-probs it is decoupled PPO (ratio against the
    proximal policy, behaviour importance weight ``pi_prox / pi_behav`` capped by
    ``ppo.behav_imp_weight_cap``), else PPO against ``behaviour``."""
    clip = dict(
        eps_clip=ppo.eps_clip,
        eps_clip_higher=ppo.eps_clip_higher,
        c_clip=ppo.c_clip,
        loss_agg_mode=ppo.loss_agg_mode,
        **counts,
    )
    advantages = advantages.to(logprobs.dtype)
    if proximal is None:
        loss, parts = ppo_policy_loss(logprobs, behaviour, advantages, mask, **clip)
    else:
        loss, parts = decoupled_ppo_policy_loss(
            logprobs,
            proximal.to(logprobs.dtype),
            behaviour,
            advantages,
            mask,
            behav_imp_weight_cap=ppo.behav_imp_weight_cap,
            **clip,
        )
    tokens = counts["global_tokens"]
    metrics = {
        "train/policy_loss": float(loss.detach()),
        "train/clip_fraction": float(parts["loss/clip_frac"]),
        "train/approx_kl": float(parts["loss/approx_kl"]),
        "train/advantage_mean": float(masked_mean(advantages, mask, global_tokens=tokens)),
    }
    if proximal is not None:
        metrics["train/behav_imp_weight"] = float(parts["loss/behav_imp_weight"])
        metrics["train/behav_drop_fraction"] = float(parts["loss/behav_drop_frac"])
    return loss, metrics


@register_strategy("grpo")
class GRPOStrategy(Strategy):
    """GRPO on offline groups with a synced old-policy copy (module docstring)."""

    sample_kind = "group"

    def __init__(self, policy: nn.Module, config: Any, **kwargs: Any) -> None:
        super().__init__(policy, config, **kwargs)
        self.ppo = config.algo.ppo
        self.adv_config = advantage_config(self.ppo)
        self.kl_ctl = float(self.ppo.kl_ctl)
        self.old_policy = None  # online subclasses get behaviour log-probs with each rollout
        if self.sample_kind == "group":
            self.old_policy = freeze(copy.deepcopy(policy))
            for param in self.old_policy.parameters():
                param.grad = None
        self.reference = frozen_reference(self.make_reference, "grpo") if self.kl_ctl else None
        self.moe = MoETerms(policy, config.algo.moe_aux_loss_coef)
        self.temperature = 1.0  # the temperature the behaviour log-probs were computed at

    def collate(self, samples: Sequence[Any]) -> dict[str, Tensor]:
        return data.collate_groups(samples, self.tokenizer.pad_token_id)

    def frozen_modules(self) -> list[nn.Module]:
        return [m for m in (self.old_policy, self.reference) if m is not None]

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """Sync the old policy to the updated policy (seed 002's offline GRPO)."""
        if self.old_policy is not None:
            self.old_policy.load_state_dict(self.policy.state_dict())

    def step_counts(self, micro_batches: list[dict[str, Tensor]]) -> dict[str, float]:
        return rl_step_counts(micro_batches, self.moe)

    def _advantages(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The advantage pipeline's outputs (next-token aligned): ``advantages``,
        ``next_loss_mask`` and ``next_logprobs`` (behaviour log-probs, when given). A batch
        that already carries them (pinned on a rollout) is returned as it is."""
        if "advantages" in batch:
            return batch
        behaviour = batch.get("logprobs")
        if behaviour is None:  # the old policy supplies the ratio's log-probs instead
            behaviour = torch.zeros_like(batch["loss_mask"], dtype=torch.float32)
        else:
            check_behaviour_logprobs(behaviour, batch["input_ids"])
        rows = batch["input_ids"].shape[0]
        inputs = {
            "attention_mask": batch["attention_mask"],
            "loss_mask": batch["loss_mask"],
            "rewards": batch["rewards"].float(),
            "group_ids": batch["group_ids"],
            "logprobs": behaviour,
            # offline rows carry no truncation flag unless the data gives one
            "no_eos": batch.get("no_eos", batch["rewards"].new_zeros(rows, dtype=torch.bool)),
        }
        return compute_advantages(inputs, self.adv_config)

    def loss(
        self, batch: dict[str, Tensor], step_counts: dict[str, float]
    ) -> tuple[Tensor, dict[str, float]]:
        adv = self._advantages(batch)
        mask = adv["next_loss_mask"]  # (N, S) bool
        ids, attn = batch["input_ids"], batch["attention_mask"]
        chunk = self.config.model.logprob_chunk_size
        out = sequence_logprobs(
            self.policy,
            ids,
            attn,
            chunk_size=chunk,
            with_entropy=True,
            temperature=self.temperature,
        )
        with torch.no_grad():
            if "logprobs" in batch:
                old_logprobs = adv["next_logprobs"].to(out.logprobs.dtype)  # (N, S)
            else:
                old_logprobs = sequence_logprobs(self.old_policy, ids, attn, chunk_size=chunk)
                old_logprobs = old_logprobs.logprobs  # (N, S)
        counts = dict(
            global_tokens=step_counts["tokens"],
            global_seqs=step_counts["seqs"],
            horizon=int(step_counts["horizon"]),
        )
        policy_loss, metrics = policy_objective(
            self.ppo, out.logprobs, old_logprobs, adv["advantages"], mask, counts,
            proximal=batch.get("proximal_logprobs"),
        )  # fmt: skip
        tokens = step_counts["tokens"]
        metrics["train/entropy"] = float(masked_mean(out.entropy, mask, global_tokens=tokens))
        loss = policy_loss + self._kl_term(batch, out.logprobs, mask, counts, metrics)
        metrics |= self._reward_metrics(batch, step_counts)
        loss, moe_metrics = self.moe.add(
            loss, out, input_ids=ids, attention_mask=attn, step_counts=step_counts
        )
        return loss, {"train/loss": float(loss.detach()), **metrics, **moe_metrics}

    def _kl_term(
        self, batch: dict[str, Tensor], logprobs: Tensor, mask: Tensor, counts: dict, metrics: dict
    ) -> Tensor | float:
        """``kl_ctl * agg_loss(KL(pi || pi_ref))`` aggregated like the surrogate (``counts``:
        the global counts of :func:`ardea.algo.agg_loss`); records ``train/kl``. 0 without a
        reference."""
        if self.reference is None:
            return 0.0
        chunk = self.config.model.logprob_chunk_size
        with torch.no_grad():
            ref = sequence_logprobs(
                self.reference,
                batch["input_ids"],
                batch["attention_mask"],
                chunk_size=chunk,
                temperature=self.temperature,
            ).logprobs  # (N, S)
        kl = kl_penalty(logprobs, ref, self.ppo.kl_estimator)  # (N, S)
        kl_loss = agg_loss(kl, mask, self.ppo.loss_agg_mode, **counts)
        metrics["train/kl"] = float(masked_mean(kl, mask, global_tokens=counts["global_tokens"]))
        return self.kl_ctl * kl_loss

    @staticmethod
    def _reward_metrics(batch: dict[str, Tensor], step_counts: dict[str, float]) -> dict:
        """Reward mean and std over the step's completions, split by this batch's row share."""
        rewards = batch["rewards"].detach().float()
        share = rewards.numel() / max(step_counts["rows"], 1.0)
        return {
            "train/reward_mean": float(rewards.sum()) / max(step_counts["rows"], 1.0),
            "train/reward_std": step_counts["reward_std"] * share,
        }

"""Online GRPO (``online_grpo``): the GRPO loss on fresh rollouts of the live policy.

Each step the rollout runner samples ``rollout.group_size`` completions per prompt with the
engine (behaviour log-probs recorded), scores them with ``reward.functions`` (plus DAPO's
overlong penalty when ``reward.overlong_buffer > 0``), and the loss of
:mod:`ardea.trainer.strategies.grpo` runs on that group batch with the behaviour log-probs
as the ratio's denominator, so no old-policy copy is kept. The step's shared parts (the
staleness bound, epochs and mini-batches, publication) are in
:mod:`ardea.trainer.strategies.online`.

Pinned on the whole rollout before any update (:meth:`prepare_rollout`): the group
advantages of ``algo.ppo.adv_estimator`` (``grpo`` by default; ``dr_grpo``, ``rloo``,
``reinforce_pp``, ``reinforce_pp_baseline`` or a dotted path), computed over all the step's
groups at once, and for decoupled PPO the proximal log-probs of the policy before the step.

DAPO's dynamic sampling (``algo.dynamic_sampling``, Yu et al. 2025, section 3.2): groups
whose rewards are all equal carry no gradient under group baselines and are dropped; the
batch is refilled with the groups of fresh prompts (drawn from the training set by a sampler
of this strategy whose position is saved with the run), generated on the live policy, for at
most ``algo.dynamic_sampling_max_rounds`` rounds; the batch is then cut to the step's number
of prompts. A refill round generates ``k`` batches of ``trainer.batch_size`` prompts,

    k = min(algo.dynamic_sampling_max_refill, ceil(missing groups / (kept share × B))),

with the kept share counted over every group generated so far in the step (``k`` = the cap
when none was kept): late in training, when most groups are solved, one large round replaces
many small ones, and batched generation makes it the cheaper way to a full batch. Metrics:
``rollout/groups_kept`` (fraction of the first round's groups with a reward spread) and
``rollout/refill_rounds``. The other DAPO parts are options too: clip-higher
(``algo.ppo.eps_clip_higher``), token-mean loss (``algo.ppo.loss_agg_mode``) and the
overlong penalty. Dr. GRPO is ``adv_estimator=dr_grpo`` with
``loss_agg_mode=seq-mean-token-sum-norm``.

Trainer log-probs use the rollout temperature (``rollout.temperature``, T = 0 counts as 1),
so the ratio compares the same distributions the engine sampled from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ardea.data import Example, concat_rows, select_rows
from ardea.data.sampler import EpochSampler
from ardea.trainer.strategies.base import register_strategy
from ardea.trainer.strategies.grpo import GRPOStrategy
from ardea.trainer.strategies.online import OnlineRollouts

PINNED_KEYS = ("advantages", "returns", "next_loss_mask", "next_logprobs")
REFILL_SEED_STREAM = 7  # seed offset of the refill sampler and its rollouts


def pad_values(pad_token_id: int) -> dict[str, int]:
    """Padding of the (N, S) keys of a rollout batch (others pad with 0)."""
    return {"input_ids": pad_token_id, "versions": -1, "turn_ids": -1}


def groups_with_spread(batch: dict[str, Tensor]) -> Tensor:
    """``(N,)`` bool: rows whose group's rewards are not all equal (max > min, exactly: a
    group std from :func:`ardea.algo.group_stats` can be a rounding error above 0)."""
    groups, inverse = torch.unique(batch["group_ids"], return_inverse=True)
    rewards = batch["rewards"].float()
    high = torch.full((len(groups),), -torch.inf, device=rewards.device)
    low = torch.full((len(groups),), torch.inf, device=rewards.device)
    high = high.scatter_reduce(0, inverse, rewards, "amax")
    low = low.scatter_reduce(0, inverse, rewards, "amin")
    return (high > low)[inverse]


@register_strategy("online_grpo")
class OnlineGRPOStrategy(OnlineRollouts, GRPOStrategy):
    sample_kind = "prompt"

    def __init__(self, policy: nn.Module, config: Any, **kwargs: Any) -> None:
        super().__init__(policy, config, **kwargs)
        self._init_online()
        self.refill_sampler: EpochSampler | None = None
        self.pool: Sequence[Example] = ()

    def collate(self, samples: Sequence[Example]) -> dict[str, Tensor]:
        raise TypeError("online_grpo builds its batches from rollouts (plan_step)")

    def bind_data(self, samples: Sequence[Example]) -> None:
        self.pool = samples
        if self.config.algo.dynamic_sampling:
            seed = self.config.trainer.seed * 1_000_003 + REFILL_SEED_STREAM
            self.refill_sampler = EpochSampler(len(samples), self.config.trainer.batch_size, seed)

    def prepare_rollout(
        self, batch: dict[str, Tensor], *, step: int, metrics: dict[str, float]
    ) -> dict[str, Tensor]:
        if self.config.algo.dynamic_sampling:
            batch = self._dynamic_sampling(batch, step, metrics)
        if batch["rewards"].numel() == 0:  # every group was dropped: nothing to train on
            return batch
        advantages = self._advantages(batch)  # over the whole rollout, next-token aligned
        pinned = {**batch, **{k: advantages[k] for k in PINNED_KEYS}}
        if self.decoupled:
            pinned["proximal_logprobs"] = self.proximal_logprobs(batch)
        return pinned

    def _dynamic_sampling(
        self, batch: dict[str, Tensor], step: int, metrics: dict[str, float]
    ) -> dict[str, Tensor]:
        """Keep groups with a reward spread; refill from fresh prompts (module docstring)."""
        wanted = int(torch.unique(batch["group_ids"]).numel())
        keep = groups_with_spread(batch)
        metrics["rollout/groups_kept"] = float(keep.float().mean())
        parts = [select_rows(batch, torch.nonzero(keep).squeeze(-1))]
        have, generated = _groups(parts[0]), wanted
        next_group = int(batch["group_ids"].max()) + 1  # refilled groups get ids past these
        rounds = 0
        while have < wanted and rounds < self.config.algo.dynamic_sampling_max_rounds:
            rounds += 1
            batches = refill_batches(
                wanted - have, kept=have, generated=generated,
                batch_size=self.config.trainer.batch_size,
                cap=self.config.algo.dynamic_sampling_max_refill,
            )  # fmt: skip
            indices = [i for _ in range(batches) for i in self.refill_sampler.next_batch()]
            examples = [self.pool[i] for i in indices]
            generated += len(examples)
            refill = self.runner.rollout(examples, seed_index=(step, REFILL_SEED_STREAM, rounds))
            # refills are generation and scoring, not advantages: count them where they belong
            for key in ("perf/time_generate", "perf/time_score"):
                metrics[key] = metrics.get(key, 0.0) + refill.metrics.get(key, 0.0)
            extra = self.to_device(refill.batch)
            extra["group_ids"] = extra["group_ids"] + next_group
            next_group = int(extra["group_ids"].max()) + 1
            extra = select_rows(extra, torch.nonzero(groups_with_spread(extra)).squeeze(-1))
            parts.append(extra)
            have += _groups(extra)
        metrics["rollout/refill_rounds"] = float(rounds)
        merged = concat_rows(parts, pad_values(self.tokenizer.pad_token_id))
        first = torch.unique_consecutive(merged["group_ids"])[:wanted]
        return select_rows(
            merged, torch.nonzero(torch.isin(merged["group_ids"], first)).squeeze(-1)
        )

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.refill_sampler is not None:
            state["refill_sampler"] = self.refill_sampler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.refill_sampler is not None and "refill_sampler" in state:
            self.refill_sampler.load_state_dict(state["refill_sampler"])


def refill_batches(missing: int, *, kept: int, generated: int, batch_size: int, cap: int) -> int:
    """Batches of prompts for the next refill round: ``ceil(missing / (share × B))`` with
    ``share = kept / generated`` groups so far in the step, between 1 and ``cap``."""
    if kept == 0:
        return cap
    return max(1, min(cap, math.ceil(missing * generated / (kept * batch_size))))


def _groups(batch: dict[str, Tensor]) -> int:
    return int(torch.unique(batch["group_ids"]).numel())

"""On-policy distillation: a teacher scores the student's own samples token by token.

For every sampled token ``y_t`` of the rollout the teacher's log-prob ``log q(y_t)`` is set
against the student's behaviour log-prob ``log p(y_t)`` (the engine's, at the sampling
distribution; the teacher is scored at the same temperature, top-k and top-p), and the
token gets the process reward

    r_t = -coef * KL_t,   KL_t = log p - log q              (algo.teacher.kl = reverse_k1)
                          KL_t = q/p - 1 - log(q/p)          (reverse_k3)

a one-sample estimate of the reverse KL ``KL(p || q)`` at that token (Agarwal et al. 2024,
GKD; Lu & Thinking Machines 2025, "On-policy distillation": k1 as the per-token
advantage). The rewards reach the advantages through
:class:`ardea.algo.AdvantageInputs` ``.process_rewards`` (GRPO's estimators add each token's
own to its advantage, GAE takes them as rewards), beside any task reward
(``reward.functions``; a weight of 0 logs the task reward without training on it).

The teacher is a Hugging Face causal LM from ``algo.teacher.path`` (loaded in
``model.dtype`` on the policy's device, frozen, wrapped like the policy) with the policy's
tokenizer: the same token ids must mean the same text, so a different vocabulary is a
:class:`~ardea.errors.ConfigError`. It scores each rollout once, when the strategy pins it.

Metrics: ``teacher/reverse_kl`` (mean k1 estimate ``log p - log q`` over the trained
tokens, whichever ``kl`` is chosen: the distance left to the teacher) and
``teacher/reward_mean`` (mean ``r_t`` over them).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ardea.algo import kl_penalty, masked_mean
from ardea.data import TrajectoryBatch
from ardea.errors import ConfigError
from ardea.model import load_model_and_tokenizer
from ardea.trainer.strategies.token_scorer import TokenScorer

ESTIMATORS = {"reverse_k1": "k1", "reverse_k3": "k3"}


class Teacher:
    """The teacher's per-token rewards on a rollout (module docstring).

    Args:
        scorer: the teacher's :class:`TokenScorer`.
        kl: ``reverse_k1`` or ``reverse_k3``.
        coef: the weight of the reward.
    """

    def __init__(self, scorer: TokenScorer, *, kl: str, coef: float) -> None:
        self.scorer = scorer
        self.estimator = ESTIMATORS[kl]
        self.coef = float(coef)

    @classmethod
    def from_config(cls, strategy: Any) -> Teacher:
        """The teacher of ``strategy``'s ``algo.teacher`` (its path, loaded and wrapped)."""
        config = strategy.config
        section = config.algo.teacher
        device = next(strategy.policy.parameters()).device
        model, tokenizer = load_model_and_tokenizer(
            section.path, dtype=config.model.dtype, device=str(device)
        )
        check_same_vocabulary(section.path, tokenizer, strategy.tokenizer)
        wrapped = strategy.wrap(model.requires_grad_(False).eval(), trainable=False)
        scorer = TokenScorer(wrapped, config.model.logprob_chunk_size)
        return cls(scorer, kl=section.kl, coef=section.coef)

    def rewards(self, batch: TrajectoryBatch, metrics: dict[str, float]) -> Tensor:
        """``(N, S)`` next-token aligned process rewards ``-coef * KL_t`` on the trained
        tokens (0 elsewhere); adds the ``teacher/*`` metrics."""
        mask = batch.action_mask
        student = batch.behaviour_logprobs  # (N, S), the sampled tokens' log p
        teacher = self.scorer.logprobs(batch)  # (N, S), their log q
        rewards = -self.coef * kl_penalty(student, teacher, self.estimator)
        rewards = rewards.where(mask, 0.0)
        gap = (student - teacher).where(mask, 0.0)  # behaviour log-probs may be NaN off mask
        metrics["teacher/reverse_kl"] = float(masked_mean(gap, mask))
        metrics["teacher/reward_mean"] = float(masked_mean(rewards, mask))
        return rewards


def check_same_vocabulary(path: str, teacher: Any, student: Any) -> None:
    """A :class:`ConfigError` unless the two tokenizers map the same strings to the same ids."""
    theirs, ours = teacher.get_vocab(), student.get_vocab()
    if theirs == ours:
        return
    differing = sorted(set(theirs.items()) ^ set(ours.items()))[:3]
    raise ConfigError(
        f"algo.teacher.path={path!r}: the teacher's tokenizer differs from the policy's "
        f"({len(theirs)} against {len(ours)} tokens; e.g. {differing}); distillation compares "
        "the log-probs of the same token ids, so the teacher must share the policy's tokenizer"
    )

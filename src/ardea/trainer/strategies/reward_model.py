"""Reward-model training (``reward_model``): Bradley–Terry on preference pairs.

The trained model is a sequence scorer (:mod:`ardea.model.scorer`): the starting model's
backbone under a one-label head, in the family's Hugging Face sequence-classification
class, started from ``model.path`` (a causal LM, or a reward model to go on training) or
the tiny model. Each row ``prompt + reply`` gets one score ``r`` at its last token, and the
loss is :func:`ardea.algo.bradley_terry_loss` over the pairs of the optimizer step::

    loss = sum_pairs [-log sigmoid(r_w - r_l - algo.rm_margin)
                      + algo.rm_center_coef * (r_w + r_l)^2] / P_step

Batch: a :class:`~ardea.data.TrajectoryBatch` in the preference layout
(:func:`ardea.data.preference_pairs`, the DPO data format): ``P`` chosen rows, then their
``P`` rejected rows. Checkpoints' ``policy/`` hold the scorer as a Hugging Face
``AutoModelForSequenceClassification`` checkpoint with its tokenizer, which the
``reward_model`` reward function scores with.

Metrics (sums over micro-batches give the step value): ``train/loss``, ``train/bt_loss``,
``train/rm_accuracy`` (fraction of pairs scored the right way round),
``train/rm_margin`` (mean ``r_w - r_l``), ``train/score_chosen``, ``train/score_rejected``;
on held-out pairs (``data.eval_path``, or the task's test split) ``eval/loss`` and
``eval/rm_accuracy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from ardea import data
from ardea.algo import bradley_terry_loss
from ardea.data import TrajectoryBatch, preference_pairs
from ardea.trainer.strategies.base import Strategy, register_strategy

METRICS = {
    "loss/bt": "bt_loss",
    "loss/accuracy": "rm_accuracy",
    "loss/score_margin": "rm_margin",
    "loss/score_chosen": "score_chosen",
    "loss/score_rejected": "score_rejected",
}


@register_strategy("reward_model")
class RewardModelStrategy(Strategy):
    """Bradley–Terry training of a sequence scorer (module docstring)."""

    sample_kind = "preference"
    model_head = "scorer"
    eval_metrics = ("rm_accuracy",)

    def __init__(self, policy: nn.Module, config: Any, **kwargs: Any) -> None:
        super().__init__(policy, config, **kwargs)
        self.margin = float(config.algo.rm_margin)
        self.center_coef = float(config.algo.rm_center_coef)

    def collate(self, samples: Sequence[Any]) -> TrajectoryBatch:
        return data.collate_preference(samples, self.tokenizer.pad_token_id)

    def step_counts(self, micro_batches: list[TrajectoryBatch]) -> dict[str, float]:
        return {"pairs": float(sum(len(preference_pairs(b)[0]) for b in micro_batches))}

    def scores(self, batch: TrajectoryBatch) -> Tensor:
        """``(N,)`` float32 score of every row: the model's one logit at its last token."""
        out = self.policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        return out.logits[:, 0].float()

    def loss(
        self, batch: TrajectoryBatch, step_counts: dict[str, float]
    ) -> tuple[Tensor, dict[str, Tensor | float]]:
        chosen, rejected = preference_pairs(batch)  # (P,) row indices each
        scores = self.scores(batch)  # (2P,)
        loss, parts = bradley_terry_loss(
            scores[chosen],
            scores[rejected],
            margin=self.margin,
            center_coef=self.center_coef,
            global_pairs=step_counts["pairs"],
        )
        metrics = {f"train/{name}": parts[key].detach() for key, name in METRICS.items()}
        return loss, {"train/loss": loss.detach(), **metrics}

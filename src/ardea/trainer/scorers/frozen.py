"""The frozen models a run scores tokens with, built once from the config and pinned by the
step: the reference of a KL term or a preference loss (a frozen copy of the initial policy)
and a distillation teacher (in process or on a vLLM server), each behind one seam, a
:class:`~ardea.trainer.scorers.token_scorer.TokenScorer`.

Online, the RL step pins both on the whole rollout once per step (:meth:`FrozenScorers.pin`:
``ref_logprobs``; the teacher's ``process_rewards`` or top tokens), before the strategy pins
its advantages; offline strategies score each micro-batch with the reference once (one
update per step). Strategies never build or launch them: :func:`build_scorers` does, for the
strategy class the config names (its ``wants_reference(config)``, its ``supports_teacher``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ardea.data import TrajectoryBatch
from ardea.errors import ConfigError
from ardea.trainer.row_shards import ONE_PROCESS, RowShards
from ardea.trainer.scorers.teacher import Teacher, check_teacher
from ardea.trainer.scorers.token_scorer import TokenScorer


@dataclass
class FrozenScorers:
    """A run's frozen scorers (module docstring); None where the run has none."""

    reference: TokenScorer | None = None
    teacher: Teacher | None = None
    rows: RowShards = ONE_PROCESS  # this rank's share of a rollout's rows

    def pin(self, batch: TrajectoryBatch, metrics: dict[str, float]) -> TrajectoryBatch:
        """The rollout with the reference's ``ref_logprobs`` and the teacher's scores
        pinned, once per step (every epoch and mini-batch reuses them; under torchrun each
        rank scores its share of the rows, :class:`~ardea.trainer.row_shards.RowShards`);
        ``teacher/*`` metrics into ``metrics``."""
        if self.reference is not None:
            batch = batch.pin(ref_logprobs=self.rows.map(batch, self.reference.logprobs))
        if self.teacher is not None:
            batch = self.teacher.pin(batch, metrics, self.rows)
        return batch

    def close(self) -> None:
        """Stop what was started for them (a teacher's vLLM server)."""
        if self.teacher is not None:
            self.teacher.close()


def build_scorers(
    config: Any,
    strategy: type,
    *,
    tokenizer: Any,
    device: torch.device,
    make_reference: Callable[[], torch.nn.Module] | None,
    wrap: Callable[..., torch.nn.Module],
    rows: RowShards = ONE_PROCESS,
) -> FrozenScorers:
    """The frozen scorers ``strategy`` (a class) needs under ``config`` (module docstring).

    Args:
        make_reference: a fresh, unwrapped copy of the initial policy (the reference).
        wrap: ``wrap(module, trainable=False)`` wraps a frozen model for data parallelism
            as the policy is.
    """
    reference = None
    if strategy.wants_reference(config):
        if make_reference is None:
            raise ConfigError(
                f"strategy {config.algo.name!r} needs a copy of the initial policy (its "
                "frozen reference): pass make_reference (a function building it) to make_strategy"
            )
        model = make_reference().requires_grad_(False).eval()
        reference = TokenScorer(wrap(model, trainable=False), config.model.logprob_chunk_size)
    teacher = None
    if config.algo.teacher.path is not None:
        check_teacher(strategy, config)
        teacher = Teacher.from_config(config, tokenizer=tokenizer, wrap=wrap, device=device)
    return FrozenScorers(reference, teacher, rows)

"""Training strategies: what loss a batch gives. The loop owns everything else.

A strategy is created by registered name (``algo.name``). It declares which kind of
training sample it consumes (``sample_kind``), collates samples into a
:class:`~ardea.data.TrajectoryBatch`, and turns a micro-batch into a scalar loss plus
metrics. Optimizer, accumulation, clipping, schedule, evaluation and checkpoints belong to
the training loop, so every strategy runs under the same loop; an online strategy
(:class:`OnlineStrategy`) also supplies what the RL step (:mod:`ardea.trainer.step.rl_step`)
pins on a rollout before its updates.

Sample kinds (built by :mod:`ardea.data`): ``text`` (every token trained), ``sft``
(prompt + answer, loss on the answer), ``preference`` (prompt, chosen, rejected),
``labeled`` (prompt, completion, desirable or not) and ``group`` (a prompt with G scored completions) and ``prompt`` (task examples that the RL
step turns into scored rollouts).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from ardea.config import ArdeaConfig
from ardea.data import TrajectoryBatch
from ardea.errors import ConfigError
from ardea.model import sequence_logprobs
from ardea.registry import Registry, subclass_check
from ardea.trainer.components import TrainedComponent
from ardea.trainer.row_shards import ONE_PROCESS, RowShards
from ardea.trainer.scorers import FrozenScorers, build_scorers

SAMPLE_KINDS = ("text", "sft", "preference", "labeled", "group", "prompt")
MODEL_HEADS = ("causal_lm", "scorer")


class Strategy(ABC):
    """Computes the loss of a micro-batch.

    ``loss`` must be normalised by the counts of the *whole* optimizer step passed in
    ``step_counts`` (e.g. ``{"tokens": ...}``), never by the micro-batch's own, so that
    summing the gradients of the micro-batches equals the gradient of the full batch.
    Metrics returned by ``loss`` are likewise normalised so that the loop can sum them
    over micro-batches.

    Args:
        policy: the model being trained.
        config: the run config.
        tokenizer: the policy's tokenizer (pad id for collation).
        make_reference: builds a fresh copy of the *initial* policy (same weights the run
            started from), e.g. for a critic warm-started from it.
        wrap: ``wrap(module, trainable=...)`` wraps a module the strategy builds (a critic)
            for data parallelism as the policy is (DDP / FSDP2); by default modules stay as
            they are.
        scorers: the run's frozen scorers (:mod:`ardea.trainer.scorers`): the reference a
            strategy ``wants_reference`` for, a teacher; :func:`make_strategy` builds them.
    """

    sample_kind: ClassVar[str] = "sft"
    #: the model the strategy trains: ``causal_lm`` (a policy that generates) or ``scorer``
    #: (one score per text, :mod:`ardea.model.scorer`; nothing is generated in the run)
    model_head: ClassVar[str] = "causal_lm"
    #: loss metrics (``train/<name>``) also reported on held-out samples as ``eval/<name>``
    eval_metrics: ClassVar[tuple[str, ...]] = ()
    #: whether the loss always reads a frozen reference (:meth:`wants_reference`)
    uses_reference: ClassVar[bool] = False

    def __init__(
        self,
        policy: torch.nn.Module,
        config: ArdeaConfig,
        *,
        tokenizer: Any,
        make_reference: Callable[[], torch.nn.Module] | None = None,
        wrap: Callable[..., torch.nn.Module] | None = None,
        scorers: FrozenScorers | None = None,
        rows: RowShards = ONE_PROCESS,
    ) -> None:
        self.policy = policy
        self.rows = rows  # this rank's share of a rollout's rows (pinning)
        self.config = config
        self.tokenizer = tokenizer
        self.make_reference = make_reference
        self._wrap = wrap
        self.scorers = scorers if scorers is not None else FrozenScorers()
        self.reference = self.scorers.reference  # the frozen initial policy, if wanted

    @classmethod
    def wants_reference(cls, config: ArdeaConfig) -> bool:
        """Whether the loss reads a frozen reference under ``config`` (a KL term, a
        preference loss); :func:`~ardea.trainer.scorers.build_scorers` builds it. By default
        the class's ``uses_reference``."""
        return cls.uses_reference

    def wrap(self, module: torch.nn.Module, *, trainable: bool) -> torch.nn.Module:
        """``module`` wrapped for data parallelism like the policy (see ``wrap``)."""
        return self._wrap(module, trainable=trainable) if self._wrap is not None else module

    def initial_policy(self) -> torch.nn.Module:
        """A fresh, unwrapped copy of the initial policy from ``make_reference``; an error
        names the strategy that needs it."""
        if self.make_reference is None:
            raise ConfigError(
                f"strategy {self.config.algo.name!r} needs a copy of the initial policy: pass "
                "make_reference (a function building it) to make_strategy"
            )
        return self.make_reference()

    @abstractmethod
    def collate(self, samples: Sequence[Any]) -> TrajectoryBatch:
        """Samples of ``sample_kind`` → one micro-batch."""

    @abstractmethod
    def step_counts(self, micro_batches: list[TrajectoryBatch]) -> dict[str, float]:
        """Normalisers over all micro-batches of one optimizer step."""

    @abstractmethod
    def loss(
        self, batch: TrajectoryBatch, step_counts: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        """Scalar loss of ``batch`` and its metrics: values that add up across micro-batches,
        floats or 0-d tensors (the trainer reads every update's tensors at once, so a loss
        that keeps its metrics as tensors makes no host sync for them)."""

    def trained_components(self) -> list[TrainedComponent]:
        """Modules besides the policy that the loss trains, each with its optimizer (e.g. a
        critic); the updater steps, clips and checkpoints them like the policy."""
        return []

    def close(self) -> None:  # noqa: B027 - most strategies start nothing
        """Release what the strategy started (called once training ends)."""


class OnlineStrategy(Strategy):
    """A strategy trained on fresh rollouts (``sample_kind = "prompt"``).

    The RL step (:mod:`ardea.trainer.step.rl_step`) generates and scores the rollout, keeps the
    groups the step trains on, pins the frozen scorers' values (reference log-probs, a
    teacher's), then calls :meth:`pin` once on the whole rollout: the strategy pins
    everything else its loss needs (advantages, returns, old values, proximal log-probs,
    preference pairs), so every pass over the rollout reuses the same targets.
    """

    sample_kind = "prompt"
    #: whether DAPO's dynamic sampling (``algo.dynamic_sampling``) applies to this strategy
    supports_dynamic_sampling: ClassVar[bool] = False
    #: whether a distillation teacher (``algo.teacher``) enters its advantages (per-token
    #: rewards) or its loss (forward KL)
    supports_teacher: ClassVar[bool] = False

    def collate(self, samples: Sequence[Any]) -> TrajectoryBatch:
        raise TypeError(f"{type(self).__name__} trains on rollouts, not collated samples")

    @abstractmethod
    def pin(self, batch: TrajectoryBatch, metrics: dict[str, float]) -> TrajectoryBatch:
        """The rollout with what the loss needs pinned; may add ``rollout/*`` metrics."""

    @torch.no_grad()
    def policy_logprobs(self, batch: TrajectoryBatch) -> torch.Tensor:
        """``(N, S)`` next-token log-probs of the policy as it is now, at the batch's
        temperature (decoupled PPO's proximal policy when called before the updates); under
        torchrun each rank computes its share of the rows (``self.rows``)."""
        chunk = self.config.model.logprob_chunk_size
        return self.rows.map(batch, lambda rows: sequence_logprobs(
            self.policy, **rows.model_inputs(), chunk_size=chunk, **rows.sampling()
        ).logprobs)  # fmt: skip


def _check_strategy(name: str, cls: object) -> None:
    subclass_check(Strategy, "ardea.trainer.Strategy")(name, cls)
    kind = getattr(cls, "sample_kind", None)
    if kind not in SAMPLE_KINDS:
        raise ConfigError(f"strategy {name!r}: sample_kind={kind!r} not in {SAMPLE_KINDS}")
    head = getattr(cls, "model_head", None)
    if head not in MODEL_HEADS:
        raise ConfigError(f"strategy {name!r}: model_head={head!r} not in {MODEL_HEADS}")


STRATEGIES: Registry[type[Strategy]] = Registry(
    "strategy", "strategies", field="algo.name", check=_check_strategy
)


def register_strategy(name: str) -> Callable[[type[Strategy]], type[Strategy]]:
    """Class decorator: make a :class:`Strategy` available as ``algo.name=<name>``."""
    return STRATEGIES.register(name)


def strategy_names() -> list[str]:
    return STRATEGIES.names()


def strategy_class(name: str) -> type[Strategy]:
    """The strategy registered as ``name``, or the :class:`Strategy` subclass at dotted
    path ``name``."""
    return STRATEGIES.get(name)


def make_strategy(
    name: str,
    policy: torch.nn.Module,
    config: ArdeaConfig,
    *,
    tokenizer: Any,
    make_reference: Callable[[], torch.nn.Module] | None = None,
    wrap: Callable[..., torch.nn.Module] | None = None,
    device: torch.device | None = None,
    rows: RowShards = ONE_PROCESS,
) -> Strategy:
    """The strategy ``name`` on ``policy``, with the frozen scorers it needs built first
    (:func:`~ardea.trainer.scorers.build_scorers`: a reference, a teacher); ``rows``: how
    this rank shares a rollout's rows with the others when pinning (default: one process)."""
    cls = strategy_class(name)
    wrap = wrap or (lambda module, trainable: module)
    device = device if device is not None else next(policy.parameters()).device
    scorers = build_scorers(
        config, cls, tokenizer=tokenizer, device=device, make_reference=make_reference,
        wrap=wrap, rows=rows,
    )  # fmt: skip
    return cls(
        policy, config, tokenizer=tokenizer, make_reference=make_reference, wrap=wrap,
        scorers=scorers, rows=rows,
    )  # fmt: skip

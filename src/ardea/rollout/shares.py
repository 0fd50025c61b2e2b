"""A rollout split over the ranks of a torchrun job: each rank's share, and every rank's
shares joined into the whole.

Rank ``r`` generates the contiguous share ``Ranks.rows.share(P)`` of a call's ``P`` prompts
(whole groups: a prompt's G completions or episodes never straddle two ranks), with
``first_prompt`` at its place, so that every row samples with its index in the whole call.
:meth:`RolloutShares.joined` sends each rank's share in its checkpoint form (plain lists
and dicts: ``Runner.generation_state``, not the engine's or an environment's objects) to
every rank in one all-gather, restores the others' there and joins them in rank order
(``Runner.join``): every rank then holds the one generation a single process makes. An
error on one rank is raised on every rank, naming it on the others, so that none waits
in a collective for a rank that failed. With one process the share is the whole call and
nothing is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ardea.errors import ArdeaError
from ardea.rollout.runner_protocol import Runner
from ardea.timing import PhaseTimer


class Shares(Protocol):
    """How the ranks share ``count`` items (the trainer's
    :class:`~ardea.trainer.row_shards.RowShards`)."""

    rank: int
    world_size: int

    def share(self, count: int) -> range:
        """This rank's contiguous share; the shares of ranks 0, 1, ... cover ``range(count)``
        in order."""


class Ranks(Protocol):
    """The processes of a run, as the rollout needs them (the trainer's
    :class:`~ardea.trainer.distributed.Distributed` is one)."""

    active: bool  # several processes (torchrun)
    rows: Shares

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""


class RolloutShares:
    """This rank's part in a rollout split over the ranks (module docstring).

    Args:
        dist: this process's rank.
    """

    def __init__(self, dist: Ranks) -> None:
        self.dist = dist

    @property
    def ranks(self) -> int:
        """How many ranks generate a share."""
        return self.dist.rows.world_size

    @property
    def rank(self) -> int:
        """This rank's place among :attr:`ranks`."""
        return self.dist.rows.rank

    def share(self, count: int) -> range:
        """This rank's share of ``count`` prompts."""
        return self.dist.rows.share(count)

    def gathered(self, compute: Callable[[], Any]) -> list[Any]:
        """``compute()`` on every rank, and every rank's result in rank order; an error on
        one rank is raised on every rank (naming it on the others)."""
        if not self.dist.active:
            return [compute()]
        result, error = _attempt(compute)
        gathered = self.dist.gather((result, None if error is None else repr(error)))
        if error is not None:
            raise error
        for rank, (_, problem) in enumerate(gathered):
            if problem is not None:
                raise ArdeaError(f"the rollout on rank {rank} failed: {problem}")
        return [part for part, _ in gathered]

    def generated(
        self,
        runner: Runner,
        examples: Sequence[Any],
        seed_index: int | tuple[int, ...],
        timer: PhaseTimer,
    ) -> Any:
        """The scored generation of ``examples``: this rank's share generated (phase
        ``generate``) and scored (``score``) here, every rank's share joined."""
        share = self.share(len(examples))

        def mine() -> Any:
            if not share:  # fewer prompts than ranks
                return None
            with timer.phase("generate"):
                part = runner.generate(
                    examples[share.start : share.stop], seed_index=seed_index,
                    first_prompt=share.start,
                )  # fmt: skip
            with timer.phase("score"):
                runner.score_rewards(part)
            return part

        return self.joined(runner, mine, examples, timer)

    def joined(
        self,
        runner: Runner,
        mine: Callable[[], Any],
        examples: Sequence[Any],
        timer: PhaseTimer,
    ) -> Any:
        """The generation of ``examples`` from every rank's share: ``mine()`` makes this
        rank's (:meth:`share`; None when it has none), the others' arrive in their
        checkpoint form and are restored here; joined in rank order (module docstring)."""
        if not self.dist.active:
            return mine()
        share, own = self.share(len(examples)), []

        def sent() -> tuple[int, int, Any]:
            own.append(mine())
            state = None if own[0] is None else runner.generation_state(own[0])
            return share.start, share.stop, state

        gathered = self.gathered(sent)
        with timer.phase("gather"):
            parts = [
                own[0] if start == share.start
                else runner.restore_generation(state, list(examples[start:stop]))
                for start, stop, state in gathered if state is not None
            ]  # fmt: skip
            return runner.join(parts)


def _attempt(compute: Callable[[], Any]) -> tuple[Any, Exception | None]:
    """``compute()``'s result and no error, or no result and the error it raised (to hand
    to the other ranks before raising it here)."""
    try:
        return compute(), None
    except Exception as raised:  # handed to the other ranks by the caller, then raised
        return None, raised

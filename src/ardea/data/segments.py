"""The rows before collation: a :class:`Trajectory` is a prompt followed by
:class:`Segment` s (prompt, generated, context); :func:`row_lists` gives one trajectory's
token-aligned lists (see :mod:`ardea.data.trajectory` for the layout)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from torch import Tensor

SegmentKind = Literal["prompt", "generated", "context"]


@dataclass(frozen=True)
class Segment:
    """A span of one trajectory (module docstring). ``logprobs``, ``version`` and ``turn``
    describe generated spans only: one behaviour log-prob per token (or None), the policy
    version that produced them (-1: none, e.g. a demonstration; a tuple: one per token, for a
    completion resumed under new weights), and the turn index (None: the next one, counting
    the trajectory's generated spans from 0)."""

    kind: SegmentKind
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None = None
    version: int | tuple[int, ...] = -1
    turn: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("prompt", "generated", "context"):
            raise ValueError(f"segment kind {self.kind!r}; choose prompt, generated or context")
        if self.kind != "generated" and (self.logprobs is not None or self.version != -1):
            raise ValueError(f"a {self.kind} segment carries no log-probs and no version")
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"generated segment has {len(self.token_ids)} tokens but "
                f"{len(self.logprobs)} log-probs"
            )
        if isinstance(self.version, tuple) and len(self.version) != len(self.token_ids):
            raise ValueError(
                f"generated segment has {len(self.token_ids)} tokens but "
                f"{len(self.version)} versions"
            )

    @classmethod
    def prompt(cls, token_ids: Sequence[int]) -> Segment:
        return cls("prompt", tuple(token_ids))

    @classmethod
    def generated(
        cls,
        token_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        *,
        version: int | Sequence[int] = -1,
        turn: int | None = None,
    ) -> Segment:
        lp = None if logprobs is None else tuple(float(x) for x in logprobs)
        if not isinstance(version, int):  # per token: one int when they are all equal
            version = tuple(int(v) for v in version)
            version = version[0] if version and len(set(version)) == 1 else version
        return cls("generated", tuple(token_ids), lp, version, turn)

    @classmethod
    def context(cls, token_ids: Sequence[int]) -> Segment:
        return cls("context", tuple(token_ids))


@dataclass(frozen=True)
class Trajectory:
    """One row before collation: its segments, outcome ``reward``, ``group_id`` (which prompt
    or environment row it answers), ``no_eos`` (it ended at the length limit),
    ``rewritten_turns`` (agent rows: turns whose text the agent replaced, trained as the
    model generated them; :mod:`ardea.agent.lineage`) and ``routed_experts`` (an MoE
    engine's routing of every token of the row, ``(S_row, L, K)``, -1 where none:
    :attr:`ardea.data.TrajectoryBatch.routed_experts`)."""

    segments: tuple[Segment, ...]
    reward: float = 0.0
    group_id: int = 0
    no_eos: bool = False
    rewritten_turns: int = 0
    routed_experts: Tensor | None = field(default=None, compare=False)


def row_lists(trajectory: Trajectory, index: int) -> dict[str, list | None | bool]:
    """The token-aligned lists of one trajectory (module docstring)."""
    out: dict = {k: [] for k in ("input_ids", "loss_mask", "turn_ids", "versions")}
    logprobs: list[float] | None = []
    next_turn, any_generated = 0, False
    for segment in trajectory.segments:
        n = len(segment.token_ids)
        out["input_ids"] += list(segment.token_ids)
        is_generated = segment.kind == "generated"
        out["loss_mask"] += [is_generated] * n
        if is_generated:
            any_generated = True
            turn = next_turn if segment.turn is None else segment.turn
            if turn < next_turn:
                raise ValueError(
                    f"trajectory {index}: turn {turn} after turn {next_turn - 1}; generated "
                    "spans take increasing turn indices"
                )
            next_turn = turn + 1
            out["turn_ids"] += [turn] * n
            v = segment.version
            out["versions"] += list(v) if isinstance(v, tuple) else [v] * n
            if segment.logprobs is None:
                logprobs = None
            elif logprobs is not None:
                logprobs += list(segment.logprobs)
        else:
            out["turn_ids"] += [-1] * n
            out["versions"] += [-1] * n
            if logprobs is not None:
                logprobs += [0.0] * n
    if not out["input_ids"]:
        raise ValueError(f"trajectory {index} has no tokens")
    out["attention_mask"] = [1] * len(out["input_ids"])
    out["logprobs"] = logprobs if any_generated else None
    out["generated"] = any_generated
    return out

"""What a call of an episode runner plays (an environment's episodes, a workflow's): the
:class:`Episode` s in progress and the :class:`Episodes` of one call, and their checkpoint
form, plain lists and dicts (a run with background rollouts stores the episodes played
ahead; checkpoints load with ``weights_only=True``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ardea.agent.interaction import Interaction
from ardea.agent.reply import Reply
from ardea.errors import ConfigError
from ardea.reward import ScoreResult

if TYPE_CHECKING:
    from ardea.agent.conversation import Conversation
    from ardea.agent.env import Environment


@dataclasses.dataclass
class Episode:
    """One episode in progress: its environment, conversation and counts."""

    env: Environment | None  # None once restored from a checkpoint (the episode is over)
    group: int
    conversation: Conversation | None  # None once restored (only its calls are kept)
    messages: list[dict[str, Any]]  # the conversation's messages (the same list)
    reward: float = 0.0
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    success: bool = False
    done: bool = False
    truncated: bool = False
    row_id: int = 0  # its row of each turn's random numbers (module docstring)
    error: str | None = None  # an agent workflow that failed: why (its calls are not trained)
    rewritten_turns: int = 0  # a workflow's turns whose text its code replaced (keep_tokens)
    info: dict[str, float] = dataclasses.field(default_factory=dict)  # a workflow's numbers
    retries: int = 0  # failed attempts of its row played before this one (agent.retries)


Rows = Sequence[dict[str, Any]]  # the rows of one call (environment rows, workflow inputs)


@dataclasses.dataclass
class Episodes:
    """The played episodes of one call, before scoring (``examples``: the rows), and what
    the reward terms said of them (:mod:`ardea.agent.reward_terms`; None without terms)."""

    examples: list[dict[str, Any]]
    episodes: list[Episode]
    calls: list[Interaction]  # every episode's calls, in the order they were made
    seconds: float
    scored: ScoreResult | None = None


def join_episodes(parts: Sequence[Episodes]) -> Episodes:
    """One call's episodes from ``parts``, the consecutive shares of a rollout played side
    by side by the ranks of a torchrun job (their groups already numbered in the whole
    rollout): rows, episodes and calls in rank order, the slowest share's seconds, the reward
    terms' results joined."""
    if len(parts) == 1:
        return parts[0]
    scores = [p.scored for p in parts if p.scored is not None]
    return Episodes(
        [row for p in parts for row in p.examples],
        [e for p in parts for e in p.episodes],
        [c for p in parts for c in p.calls],
        max(p.seconds for p in parts),
        ScoreResult.join(scores) if scores else None,
    )


_CALL_FIELDS = ("input_ids", "output_ids", "logprobs", "version", "stop_reason", "reward", "id")
_EPISODE_FIELDS = ("group", "messages", "reward", "turns", "tool_calls", "tool_errors",
                   "success", "done", "truncated", "row_id", "error", "rewritten_turns", "info",
                   "retries")  # fmt: skip


def episodes_state(played: Episodes) -> dict[str, Any]:
    """Played episodes as plain lists and dicts (checkpoints load with ``weights_only``):
    the rows, every recorded call (its parent by index) and the episodes' counts."""
    calls = played.calls
    index = {id(c): i for i, c in enumerate(calls)}
    return {
        "rows": played.examples,
        "seconds": played.seconds,
        "calls": [
            {
                **{f: getattr(c, f) for f in _CALL_FIELDS},
                "group_id": c.group_id,
                "episode": c.episode,
                "parent": index[id(c.parent)] if c.parent is not None else -1,
                "messages": c.messages,
                "reply": c.reply.state(),
                "flags": [c.continued, c.orphan, c.rewritten],
            }
            for c in calls
        ],
        "episodes": [{f: getattr(e, f) for f in _EPISODE_FIELDS} for e in played.episodes],
        "scored": None if played.scored is None else dataclasses.asdict(played.scored),
    }


def restore_episodes(state: dict[str, Any], examples: list[Any]) -> Episodes:
    """Episodes stored by :func:`episodes_state`, for the same rows (a ConfigError when the
    run's data give that step other rows)."""
    if [dict(e) for e in examples] != state["rows"]:
        raise ConfigError(
            "the checkpoint's pending episodes were played on other rows than this run's "
            "data give those steps; resume with the run's own data and config"
        )
    calls: list[Interaction] = []
    for stored in state["calls"]:
        fields = {f: stored[f] for f in _CALL_FIELDS}
        parent = calls[stored["parent"]] if stored["parent"] >= 0 else None
        call = Interaction(
            **fields, parent=parent, group_id=stored["group_id"], episode=stored["episode"],
            messages=stored["messages"], reply=Reply.from_state(stored["reply"]),
        )  # fmt: skip
        call.continued, call.orphan, call.rewritten = stored["flags"]
        calls.append(call)
    # a checkpoint written before agent.retries existed has no count: none were retried
    episodes = [Episode(env=None, conversation=None, **e) for e in state["episodes"]]
    seconds, scored = float(state["seconds"]), state["scored"]
    scored = None if scored is None else ScoreResult(**scored)
    return Episodes(list(examples), episodes, calls, seconds, scored)


#: what playing one call gives: the episodes, their kept calls and the reward terms' result
Played = tuple[list[Episode], list[Interaction], ScoreResult | None]

"""Interactions (one model call each) and their export into trajectories.

An :class:`Interaction` records one call: the ``input_ids`` the model saw, the
``output_ids`` it generated with their behaviour ``logprobs``, the policy ``version`` of the
weights that generated them (one per call: an engine's update is atomic), the
``stop_reason``, a ``reward`` and an optional ``parent`` (the call this one continues). A
conversation is a chain root → ... → leaf.

Export (:func:`export_trajectories`) turns interactions into
:class:`~ardea.data.Trajectory` rows, in one of two styles:

- ``conversation``: one row per leaf (an interaction no other one continues). The child is
  concatenated onto its parent **without re-tokenizing the parent**: the parent's tokens,
  loss mask and turn ids are kept, the tokens the child's input adds after the parent's
  input + output (tool output, an environment reply, the next user message) become a
  context segment (``loss_mask`` 0, turn id −1) and the child's output the next generated
  segment (turn id = its depth in the chain). Parent ``[1,2] → [3,4]`` and child
  ``[1,2,3,4,5] → [6,7]`` give turn ids ``[-1,-1,0,0,-1,1,1]``. The row's reward is the sum
  of the chain's rewards.
- ``call``: one row per interaction (its input as the prompt, its output as turn 0), with
  the interaction's own reward (see :func:`discount_rewards` for spreading a final reward
  back over the calls).

History rewrites. When a child's input does not start with its parent's input + output
(a chat template that rewrote history, e.g. one dropping ``<think>`` blocks of earlier
turns), the tokens cannot be concatenated. ``history="error"`` raises
:class:`HistoryRewriteError` naming the first differing position and text;
``history="new_trajectory"`` starts a new row at the child (the chain is split there, the
earlier part is exported as its own row); under ``keep_tokens`` the client never makes such
a child (:mod:`ardea.agent.conversation`). Nothing is ever silently misaligned.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ardea.agent.reply import Reply
from ardea.config.agent import EXPORT_STYLES, HISTORY_POLICIES
from ardea.data import Segment, Trajectory
from ardea.errors import ArdeaError
from ardea.rollout.engine import Completion

ExportStyle = Literal["conversation", "call"]
HistoryPolicy = Literal["error", "new_trajectory", "keep_tokens"]
_ids = itertools.count()


class HistoryRewriteError(ArdeaError):
    """A child call's input does not extend its parent's tokens (history was rewritten)."""


@dataclass(eq=False)
class Interaction:
    """One model call (module docstring). ``version``: the policy version that generated
    it (a tuple, one per output token, when a weight update came during the call:
    :func:`call_versions`); ``group_id`` says which environment row or prompt the conversation answers.

    What the conversation layer reads: ``messages`` (the request's messages, normalised),
    ``reply`` (what it answered, parsed once), ``episode`` (the agent episode that made it,
    None outside workflows), ``user`` (the request's ``user``), ``rendered`` (the chat
    template's text of ``messages`` with the generation prompt, which the next turn's
    rendering must start with; None when not kept). Flags: ``continued`` (a later request
    continues it), ``orphan`` (its reply never reached the client: not continued, not
    exported), ``rewritten`` (under ``keep_tokens``, its request replaced the parent's reply
    with other text and the parent's generated tokens were kept instead)."""

    input_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    version: int | tuple[int, ...]
    stop_reason: str = "stop"
    reward: float = 0.0
    parent: Interaction | None = None
    id: str = field(default_factory=lambda: f"call-{next(_ids)}")
    group_id: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)
    reply: Reply = field(default_factory=lambda: Reply(""))
    episode: int | None = None
    user: str | None = None
    rendered: str | None = None
    continued: bool = False
    orphan: bool = False
    rewritten: bool = False

    def __post_init__(self) -> None:
        n = len(self.output_ids)
        if len(self.logprobs) != n:
            raise ValueError(
                f"interaction {self.id}: {n} output tokens but {len(self.logprobs)} log-probs"
            )
        if not self.input_ids:
            raise ValueError(f"interaction {self.id} has an empty input")

    @property
    def tokens(self) -> list[int]:
        """Input followed by output: what a child's input must start with."""
        return self.input_ids + self.output_ids

    def chain(self) -> list[Interaction]:
        """Root → ... → self."""
        out, node = [], self
        while node is not None:
            out.append(node)
            node = node.parent
        return out[::-1]


def extends(parent: Interaction, child_input: Sequence[int]) -> bool:
    """Whether ``child_input`` starts with the parent's input + output and adds to it."""
    prefix = parent.tokens
    return len(child_input) > len(prefix) and list(child_input[: len(prefix)]) == prefix


def rewrite_error(parent: Interaction, reason: str) -> HistoryRewriteError:
    """The one error of a call whose history was rewritten: the call, why, and the fix."""
    return HistoryRewriteError(
        f"the request continues call {parent.id} but {reason}, so its tokens would not "
        "extend that call's tokens: the chat template rewrote history (templates that drop "
        "<think> blocks of earlier turns do). Use a template that keeps earlier turns "
        "unchanged, send the reply back as returned, set agent.history=keep_tokens to keep "
        "the tokens the model generated (history='keep_tokens'), or agent.history="
        "new_trajectory to start a new trajectory at such a call"
    )


def departure(parent: Interaction, child_input: Sequence[int]) -> str:
    """Where ``child_input`` departs from the parent's tokens (for :func:`rewrite_error`)."""
    prefix = parent.tokens
    at = next(
        (i for i, (a, b) in enumerate(zip(prefix, child_input)) if a != b),
        min(len(prefix), len(child_input)),
    )
    return (
        f"its input tokens differ from position {at} of {len(prefix)} (the call had "
        f"{prefix[at : at + 24]}, the new input has {list(child_input[at : at + 24])})"
    )


def _check_chain(chain: list[Interaction], history: str) -> list[list[Interaction]]:
    """Split ``chain`` where a child does not extend its parent (policy ``history``)."""
    parts = [[chain[0]]]
    for parent, child in itertools.pairwise(chain):
        if extends(parent, child.input_ids):
            parts[-1].append(child)
        elif history != "new_trajectory":  # keep_tokens always extends: a split is a bug
            raise rewrite_error(parent, departure(parent, child.input_ids))
        else:
            parts.append([child])
    return parts


def conversation_trajectory(chain: Sequence[Interaction]) -> Trajectory:
    """One row for a chain in which every child extends its parent (module docstring)."""
    first = chain[0]
    segments = [Segment.prompt(first.input_ids)]
    known = len(first.input_ids)
    for turn, call in enumerate(chain):
        if known < len(call.input_ids):
            segments.append(Segment.context(call.input_ids[known:]))
        segments.append(_generated(call, turn))
        known = len(call.tokens)
    last = chain[-1]
    return Trajectory(
        tuple(segments),
        reward=float(sum(c.reward for c in chain)),
        group_id=last.group_id,
        no_eos=last.stop_reason == "length",
        rewritten_turns=sum(c.rewritten for c in chain[1:]),
    )


def _generated(call: Interaction, turn: int) -> Segment:
    return Segment.generated(call.output_ids, call.logprobs, version=call.version, turn=turn)


def export_trajectories(
    interactions: Sequence[Interaction],
    *,
    style: ExportStyle = "conversation",
    history: HistoryPolicy = "error",
) -> list[Trajectory]:
    """Rows of ``interactions`` in ``style``, rewrites handled per ``history`` (module
    docstring). Interactions without output tokens are left out."""
    if style not in EXPORT_STYLES:
        raise ValueError(f"export style {style!r}; choose one of {', '.join(EXPORT_STYLES)}")
    if history not in HISTORY_POLICIES:
        raise ValueError(f"history policy {history!r}; choose {', '.join(HISTORY_POLICIES)}")
    calls = [c for c in interactions if c.output_ids]
    if style == "call":
        return [
            Trajectory(
                (Segment.prompt(c.input_ids), _generated(c, 0)),
                reward=float(c.reward),
                group_id=c.group_id,
                no_eos=c.stop_reason == "length",
            )
            for c in calls
        ]
    parents = {id(c.parent) for c in calls if c.parent is not None}
    rows: list[Trajectory] = []
    done: set[int] = set()  # id() of interactions already exported as part of a row
    for leaf in (c for c in calls if id(c) not in parents):
        for part in _check_chain([c for c in leaf.chain() if c.output_ids], history):
            if id(part[-1]) not in done:  # a split prefix shared by two leaves goes once
                rows.append(conversation_trajectory(part))
                done.add(id(part[-1]))
    return rows


def discount_rewards(interactions: Sequence[Interaction], discount: float) -> None:
    """Spread rewards back over each conversation, in place: a call's reward becomes
    ``r_k + γ · R_{k+1}`` where ``R_{k+1}`` is its child's (already discounted) reward,
    walking each chain from its leaf, so a final reward ``R`` reaches the call ``j`` turns
    earlier as ``γ^j R`` (AReaL's turn discount). For ``style="call"`` export."""
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"reward discount must be in [0, 1], got {discount!r}")
    children: dict[int, list[Interaction]] = {}
    for c in interactions:
        if c.parent is not None:
            children.setdefault(id(c.parent), []).append(c)
    order = sorted(interactions, key=lambda c: -len(c.chain()))  # deepest first
    for call in order:
        kids = children.get(id(call), [])
        if kids:  # a branching parent takes the mean of its continuations
            call.reward = float(call.reward) + discount * sum(k.reward for k in kids) / len(kids)


def call_versions(completion: Completion, n_tokens: int) -> int | tuple[int, ...]:
    """The ``version`` of a call recording the first ``n_tokens`` of ``completion``: its
    version, or one per token when they differ (``Completion.spans``)."""
    if len(completion.spans) == 1:
        return completion.version
    return tuple(completion.token_versions[:n_tokens])

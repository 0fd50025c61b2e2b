"""Reward terms on environment episodes: the run's ``reward.functions`` scoring each episode
besides its environment.

When an ``agent.env`` run names reward functions, each episode that ended without an
infrastructure failure is scored once, when it has been played (in the background worker
when rollouts are generated there): ``prompt`` is the episode's first user message,
``completion`` its last reply's text (its ``content``, tool calls left out) and ``row`` its
environment row. The weighted sum is added to the reward of the episode's last call (so to
the episode's return, and to that call's reward under ``export: call``) and to
``episode.reward``. A failed score (a function that raises, times out or returns None or
NaN) fails the episode under ``reward.on_error: mask``: it is counted and its calls are left
out of training, like a crashed environment; under ``fail`` the run stops. The scorer's
result is kept with the episodes, and its metrics are logged with the rollout's
(``reward/failed_fraction``, per function).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ardea.reward import RewardScorer, ScoreResult


def first_user_message(messages: Sequence[dict[str, Any]]) -> str:
    """The text of the first ``user`` message ("" when there is none)."""
    return next((str(m.get("content", "")) for m in messages if m.get("role") == "user"), "")


def add_reward_terms(
    scorer: RewardScorer, pairs: Sequence[tuple[Any, Any]], rows: Sequence[dict[str, Any]]
) -> ScoreResult | None:
    """Score the episodes of ``pairs`` (``(episode, call)`` in the order the calls were made)
    and add each one's term to its last call and its reward (module docstring); returns the
    scorer's result (None: no episode to score)."""
    last: dict[int, tuple[Any, Any]] = {}
    for episode, call in pairs:
        last[id(episode)] = (episode, call)
    scored = [(e, c) for e, c in last.values() if e.error is None]
    if not scored:
        return None
    result = scorer.score(
        [first_user_message(e.messages) for e, _ in scored],
        [c.reply.content for _, c in scored],
        [rows[e.group] for e, _ in scored],
    )
    for (episode, call), value, failed in zip(scored, result.rewards, result.failed):
        if failed and scorer.on_error == "mask":
            episode.error = f"reward functions failed: {result.first_problem}"
            continue
        call.reward += value
        episode.reward += value
    return result

"""The ``agent/*`` and ``rollout/*`` metrics of played episodes (environments' and
workflows'), and how a message is shown in ``samples.jsonl``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ardea.data import TrajectoryBatch


def message_text(message: dict[str, Any]) -> str:
    """A message's text with its tool calls written out."""
    calls = "".join(f" <call {c['name']} {c['arguments']}>" for c in message.get("tool_calls", []))
    return message["content"] + calls


def episode_metrics(episodes: Sequence[Any], batch: TrajectoryBatch) -> dict[str, float]:
    """The ``agent/*`` and ``rollout/*`` metrics of a call's episodes (``docs/reference/metrics.md``)."""
    n = len(episodes)
    turns = sum(e.turns for e in episodes)
    rewards = batch.rewards.double()
    real = batch.attention_mask.bool()
    prompt = (~batch.loss_mask & real).long().cumsum(-1) == real.long().cumsum(-1)  # before turn 0
    context = real & ~batch.loss_mask & ~prompt
    return {
        "agent/turns_per_episode": turns / n,
        "agent/reward_per_turn": sum(e.reward for e in episodes) / max(turns, 1),
        "agent/success_rate": sum(e.success for e in episodes) / n,
        "agent/tool_calls": sum(e.tool_calls for e in episodes) / n,
        "agent/tool_errors": sum(e.tool_errors for e in episodes) / n,
        "agent/truncated_fraction": sum(e.truncated for e in episodes) / n,
        "agent/context_tokens": float(context.sum()) / n,
        "agent/generated_tokens": float(batch.loss_mask.sum()) / n,
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/reward_std": float(rewards.std(unbiased=False)),
        "rollout/response_length": float(batch.loss_mask.sum()) / batch.rows,
        "rollout/truncated_fraction": float(batch.no_eos.float().mean()),
    }

"""What an RL step trained, token by token: a few rows of each logged step in
``trajectories.jsonl`` (drawn by ``ardea report`` into ``trajectories.html``,
:mod:`ardea.trainer.trajectory_html`).

A record is one row after the strategy pinned its targets: ``{"step", "group", "reward",
"tokens", "trained", "turn", "logprob", "advantage", "version"}``, lists over the row's
real tokens (padding dropped). ``tokens[t]`` is token ``t`` decoded alone (special tokens
kept); ``trained[t]`` its loss mask; ``turn[t]`` its turn id (−1 outside generated
spans); ``logprob[t]`` the behaviour log-prob it was sampled with, ``advantage[t]`` the
advantage its loss used and ``version[t]`` the policy version that generated it, each
``None`` on tokens that are not trained. The batch stores advantages next-token aligned
(column ``t`` scores token ``t + 1``), so token ``t``'s is column ``t − 1``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ardea.data import TrajectoryBatch

ROWS_KEPT = 3  # rows per logged step: the first row of the first groups


def token_rows(batch: TrajectoryBatch, tokenizer: Any, kept: int = ROWS_KEPT) -> list[dict]:
    """The first row of each of the first ``kept`` groups, token by token (module
    docstring)."""
    groups = batch.group_ids.tolist() if batch.group_ids is not None else range(batch.rows)
    chosen: dict[int, int] = {}
    for row, group in enumerate(groups):
        if group not in chosen and len(chosen) < kept:
            chosen[group] = row
    return [_row(batch, tokenizer, row, group) for group, row in chosen.items()]


def _row(batch: TrajectoryBatch, tokenizer: Any, i: int, group: int) -> dict[str, Any]:
    n = int(batch.attention_mask[i].sum())  # right-padded: the real tokens come first
    ids = batch.input_ids[i, :n].tolist()
    trained = batch.loss_mask[i, :n].bool().tolist()
    advantages = [None] * n
    if batch.advantages is not None:  # next-token aligned: token t's is column t - 1
        advantages[1:] = batch.advantages[i, : n - 1].tolist()

    def at(values: list, t: int, digits: int = 4):
        return round(float(values[t]), digits) if trained[t] and values[t] is not None else None

    logprobs, versions = batch.logprobs[i, :n].tolist(), batch.versions[i, :n].tolist()
    return {
        "group": int(group),
        "reward": float(batch.rewards[i]),
        "tokens": [tokenizer.decode([t], skip_special_tokens=False) for t in ids],
        "trained": trained,
        "turn": batch.turn_ids[i, :n].tolist(),
        "logprob": [at(logprobs, t) for t in range(n)],
        "advantage": [at(advantages, t) for t in range(n)],
        "version": [int(versions[t]) if trained[t] else None for t in range(n)],
    }


def append_token_rows(run_dir: str | Path | None, step: int, rows: list[dict]) -> None:
    """Append ``step``'s rows to ``<run_dir>/trajectories.jsonl`` (nothing when
    ``run_dir`` is None: a rank other than 0 under torchrun)."""
    if run_dir is None or not rows:
        return
    with (Path(run_dir) / "trajectories.jsonl").open("a", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps({"step": step, **row}, ensure_ascii=False) + "\n")

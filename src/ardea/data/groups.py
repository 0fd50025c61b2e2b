"""Group records (a prompt with G scored completions) → samples and offline-GRPO batches.

Each completion is finished text, so its ids end with eos (raw-text prompts) or with the
chat template's end-of-turn marker (chat prompts): the model is trained to stop there.
Optional behaviour log-probs give one value per completion token, that last token
included (as an engine such as vLLM reports a completion that stopped on eos).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ardea.data.chat import check_fits, prompt_and_completion_ids
from ardea.data.records import Record
from ardea.data.shapes import expect_list, expect_number, expect_str
from ardea.data.trajectory import Segment, Trajectory, TrajectoryBatch

LOGPROB_TOLERANCE = 1e-4  # a log-prob above this is not a log-probability


@dataclass(frozen=True)
class GroupSample:
    """One prompt and its G completions with their rewards (and behaviour log-probs)."""

    prompt_ids: tuple[int, ...]
    completions: tuple[tuple[int, ...], ...]
    rewards: tuple[float, ...]
    logprobs: tuple[tuple[float, ...], ...] | None = None


def _logprobs(
    record: Record, completions: Sequence[tuple[int, ...]]
) -> tuple[tuple[float, ...], ...] | None:
    value = record.data.get("logprobs")
    if value is None:
        return None
    rows = expect_list(record, "logprobs", value)
    if len(rows) != len(completions):
        raise record.error(
            f"field 'logprobs' has {len(rows)} lists but there are {len(completions)} completions"
        )
    out = []
    for index, (row, ids) in enumerate(zip(rows, completions)):
        name = f"logprobs[{index}]"
        row = expect_list(record, name, row, nonempty=False)
        if len(row) != len(ids):
            raise record.error(
                f"field {name!r} has {len(row)} values but completion {index} has {len(ids)} "
                "tokens (its text plus the final eos / end-of-turn token)"
            )
        values = tuple(expect_number(record, f"{name}[{t}]", v) for t, v in enumerate(row))
        for t, v in enumerate(values):
            if v > LOGPROB_TOLERANCE:
                raise record.error(f"field '{name}[{t}]' = {v} is positive; log-probs are <= 0")
        out.append(values)
    return tuple(out)


def tokenize_group(
    tokenizer: Any, record: Record, *, max_length: int, chat_template: bool
) -> GroupSample:
    """A ``{"prompt", "completions", "rewards", "logprobs"?}`` record → :class:`GroupSample`."""
    texts = expect_list(record, "completions", record.data["completions"])
    rewards = expect_list(record, "rewards", record.data["rewards"])
    if len(rewards) != len(texts):
        raise record.error(
            f"field 'rewards' has {len(rewards)} values but 'completions' has {len(texts)}"
        )
    prompt_ids: list[int] | None = None
    completions = []
    for index, text in enumerate(texts):
        name = f"completions[{index}]"
        ids, completion = prompt_and_completion_ids(
            tokenizer,
            record,
            record.data["prompt"],
            expect_str(record, name, text),
            name=name,
            chat_template=chat_template,
        )
        if prompt_ids is not None and ids != prompt_ids:
            raise record.error(f"the prompt renders differently before {name!r}")
        prompt_ids = ids
        check_fits(record, len(ids), len(ids) + len(completion), max_length)
        completions.append(tuple(completion))
    return GroupSample(
        prompt_ids=tuple(prompt_ids or ()),
        completions=tuple(completions),
        rewards=tuple(expect_number(record, f"rewards[{i}]", r) for i, r in enumerate(rewards)),
        logprobs=_logprobs(record, completions),
    )


def collate_groups(samples: Sequence[GroupSample], pad_token_id: int) -> TrajectoryBatch:
    """One row per completion, ordered by sample then completion: the prompt, then the
    completion as a generated span (with its behaviour log-probs when every sample has
    them); ``group_ids`` is the sample's index in ``samples``."""
    if not samples:
        raise ValueError("cannot collate an empty list of group samples")
    with_logprobs = all(s.logprobs is not None for s in samples)
    trajectories = [
        Trajectory(
            (
                Segment.prompt(sample.prompt_ids),
                Segment.generated(completion, sample.logprobs[c] if with_logprobs else None),
            ),
            reward=sample.rewards[c],
            group_id=g,
        )
        for g, sample in enumerate(samples)
        for c, completion in enumerate(sample.completions)
    ]
    return TrajectoryBatch.from_trajectories(trajectories, pad_token_id=pad_token_id)

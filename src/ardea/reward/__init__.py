"""Reward functions and the scorer that runs them.

A reward function maps a batch to one value per completion::

    fn(prompts: list[str], completions: list[str], rows: list[dict]) -> list[float | None]

and one that declares a keyword-only ``token_ids`` is also given the batch's prompt and
completion token ids (a :class:`TokenIds`, or None where the caller has text only;
:mod:`ardea.reward.registry`). Built-ins (:mod:`ardea.reward.builtins`): ``exact_match``, ``numeric_match``,
``math_verify``, ``format_boxed``, ``format_regex`` and ``task``; ``reward_model``, a
learned reward model from a local directory (:mod:`ardea.reward.reward_model`); and
``llm_judge``, a model behind an OpenAI-compatible API grading each completion
(:mod:`ardea.reward.judge`); user functions are named by dotted path. A function may return
a :class:`ScoredValues` (its list with batch metrics). :class:`RewardScorer` sums them with weights under a per-call timeout and
a configurable policy for functions that fail (:mod:`ardea.reward.scorer`);
:func:`build_scorer` makes one from a :class:`~ardea.config.reward.RewardConfig`.
"""

from ardea.reward.build import build_scorer, check_reward_names
from ardea.reward.builtins import example_row, has_boxed, task_reward
from ardea.reward.judge import llm_judge
from ardea.reward.registry import (
    RewardFn,
    get_reward,
    make_reward,
    register_reward,
    reward_names,
    takes_token_ids,
)
from ardea.reward.reward_model import reward_model
from ardea.reward.scored import ScoredValues
from ardea.reward.scorer import (
    COUNT_KEYS,
    RewardError,
    RewardScorer,
    ScoreResult,
    failure_metrics,
)
from ardea.reward.shaping import overlong_penalty
from ardea.reward.token_ids import TokenIds, vocab_id

__all__ = [
    "COUNT_KEYS",
    "RewardError",
    "RewardFn",
    "RewardScorer",
    "ScoreResult",
    "failure_metrics",
    "ScoredValues",
    "TokenIds",
    "build_scorer",
    "check_reward_names",
    "example_row",
    "get_reward",
    "has_boxed",
    "llm_judge",
    "make_reward",
    "overlong_penalty",
    "register_reward",
    "reward_model",
    "reward_names",
    "takes_token_ids",
    "task_reward",
    "vocab_id",
]

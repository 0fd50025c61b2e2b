"""Rollout: generation engines that turn token-id prompts into completions with behaviour
log-probs and policy versions (see ``engine`` for the interface, ``inprocess`` for the default
engine, ``sampling`` for the pure sampling math, ``runner`` for G scored completions per
prompt as one trajectory batch)."""

from ardea.rollout.engine import (
    Completion,
    GenerationEngine,
    SamplingParams,
    check_prompts,
    check_state_dict,
)
from ardea.rollout.inprocess import InProcessEngine
from ardea.rollout.runner import RolloutRunner, StalenessError, check_staleness

__all__ = [
    "Completion",
    "GenerationEngine",
    "InProcessEngine",
    "RolloutRunner",
    "SamplingParams",
    "StalenessError",
    "check_prompts",
    "check_staleness",
    "check_state_dict",
]

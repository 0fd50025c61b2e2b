"""Rollout: generation engines that turn token-id prompts into completions with behaviour
log-probs and policy versions (see ``engine`` for the interface, ``inprocess`` for the default
engine, ``sampling`` for the pure sampling math)."""

from ardea.rollout.engine import (
    Completion,
    GenerationEngine,
    SamplingParams,
    check_prompts,
    check_state_dict,
)
from ardea.rollout.inprocess import InProcessEngine

__all__ = [
    "Completion",
    "GenerationEngine",
    "InProcessEngine",
    "SamplingParams",
    "check_prompts",
    "check_state_dict",
]

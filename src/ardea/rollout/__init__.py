"""Rollout: generation engines that turn token-id prompts into completions with behaviour
log-probs and policy versions (see ``engine`` for the interface, ``inprocess`` for the default
engine, ``sampling`` for the pure sampling math, ``runner`` for G scored completions per
prompt as one trajectory batch, ``worker`` for rollouts generated ahead in the background)."""

from ardea.rollout.engine import (
    Completion,
    GenerationEngine,
    SamplingParams,
    check_prompts,
    check_state_dict,
)
from ardea.rollout.inprocess import InProcessEngine
from ardea.rollout.runner import (
    Rollout,
    RolloutRunner,
    StalenessError,
    check_staleness,
    sampling_seed,
)
from ardea.rollout.worker import RolloutWorker, RolloutWorkerError

__all__ = [
    "Completion",
    "GenerationEngine",
    "InProcessEngine",
    "Rollout",
    "RolloutRunner",
    "RolloutWorker",
    "RolloutWorkerError",
    "SamplingParams",
    "StalenessError",
    "check_prompts",
    "check_staleness",
    "check_state_dict",
    "sampling_seed",
]

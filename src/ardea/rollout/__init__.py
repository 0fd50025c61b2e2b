"""Rollout: generation engines that turn token-id prompts into completions with behaviour
log-probs and policy versions (``engine`` for the interface and the engine registry,
``inprocess`` for the default engine, ``sampling`` for the pure sampling math, ``runner``
for G completions per prompt scored into one trajectory batch, ``worker`` for completions
generated ahead in the background)."""

from ardea.rollout.engine import (
    Completion,
    GenerationEngine,
    SamplingParams,
    check_prompts,
    check_state_dict,
    engine_factory,
    make_engine,
    register_engine,
    stop_token_ids,
)
from ardea.rollout.inprocess import InProcessEngine
from ardea.rollout.runner import (
    Generation,
    Rollout,
    RolloutRunner,
    StalenessError,
    check_staleness,
    sampling_seed,
)
from ardea.rollout.worker import RolloutWorker, RolloutWorkerError

__all__ = [
    "Completion",
    "Generation",
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
    "engine_factory",
    "make_engine",
    "register_engine",
    "sampling_seed",
    "stop_token_ids",
]

"""Rollout: generation engines that turn token-id prompts into completions with behaviour
log-probs and policy versions (``engine`` for the interface and the engine registry,
``inprocess`` for the default engine, ``sampling`` for the pure sampling math, ``runner``
for G completions per prompt scored into one trajectory batch, ``runner_protocol`` for the
interface every runner implements, ``worker`` for completions generated ahead in the
background)."""

from ardea.rollout import vllm_engine  # noqa: F401, E402 - registers rollout.engine=vllm
from ardea.rollout.engine import (
    Completion,
    EngineSpec,
    GenerationEngine,
    Request,
    RequestHandle,
    SamplingParams,
    Weights,
    check_prompts,
    check_state_dict,
    engine_factory,
    load_weights,
    make_engine,
    register_engine,
    stop_token_ids,
)
from ardea.rollout.inprocess import InProcessEngine, own_copy
from ardea.rollout.runner import (
    Generation,
    Rollout,
    RolloutRunner,
    StalenessError,
    check_staleness,
    sampling_seed,
)
from ardea.rollout.runner_protocol import Runner
from ardea.rollout.worker import RolloutWorker, RolloutWorkerError

__all__ = [
    "Completion",
    "EngineSpec",
    "Generation",
    "GenerationEngine",
    "InProcessEngine",
    "Rollout",
    "RolloutRunner",
    "RolloutWorker",
    "RolloutWorkerError",
    "Request",
    "RequestHandle",
    "Runner",
    "SamplingParams",
    "Weights",
    "StalenessError",
    "check_prompts",
    "check_staleness",
    "check_state_dict",
    "engine_factory",
    "load_weights",
    "make_engine",
    "own_copy",
    "register_engine",
    "sampling_seed",
    "stop_token_ids",
]

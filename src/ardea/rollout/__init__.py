"""Rollout: what turns prompts into scored trajectories for the trainer.

- the interface every engine implements and the engine registry (``engine``, with
  ``sampling_params``, ``checks`` and ``request_state``, the request bookkeeping both
  engines share);
- the engines: ``engines.inprocess`` (the default: continuous batching with a KV cache in
  this process) and ``engines.vllm`` (vLLM servers over HTTP);
- the runners: ``runner`` (G completions per prompt scored into one trajectory batch),
  ``runner_protocol`` (the interface every runner implements, the agent layer's episode
  runners included), ``worker`` (completions generated ahead in the background);
- the rollout service (``service``): owns generation for a whole run, with DAPO's dynamic
  sampling (``dynamic_sampling``).
"""

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
    per_process_engine,
    register_engine,
    stop_token_ids,
)
from ardea.rollout.engines import vllm  # noqa: F401, E402 - registers rollout.engine=vllm
from ardea.rollout.engines.inprocess import InProcessEngine, own_copy
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
    "per_process_engine",
    "register_engine",
    "sampling_seed",
    "stop_token_ids",
]

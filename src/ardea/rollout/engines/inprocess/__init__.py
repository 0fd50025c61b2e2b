"""``rollout.engine=inprocess``: continuous batching with a KV cache on a Hugging Face causal
LM in this process (``engine``: the engine; ``step_loop``: who drives a decode step;
``continuous`` and ``decode_batch``: rows joining and leaving the running batch;
``kv_cache``: the preallocated cache; ``fast_decode``: the one-token forward of the families
it serves; ``sampling``: the sampling math; ``stop_watch``: stop strings)."""

from ardea.rollout.engines.inprocess.engine import InProcessEngine, own_copy

__all__ = ["InProcessEngine", "own_copy"]

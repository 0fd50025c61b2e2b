"""``rollout.engine=vllm``: generation on vLLM OpenAI-compatible servers (``engine``: the
engine; ``pool``: several servers; ``requests``: one streamed request per row; ``server``:
launching a server; ``weights``: weight and adapter sync; ``scoring``: a server's
prompt log-probs, for a teacher; ``extension``: the code a server loads to reload weights)."""

from ardea.rollout.engines.vllm.engine import VLLMEngine

__all__ = ["VLLMEngine"]

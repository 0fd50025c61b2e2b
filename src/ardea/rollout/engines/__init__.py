"""The generation engines of ``rollout.engine``: ``inprocess`` (the default) and ``vllm``."""

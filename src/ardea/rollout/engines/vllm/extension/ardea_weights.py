"""A vLLM worker extension that loads weights sent in a request, for servers that do not
share a disk with the trainer (``rollout.vllm.weight_transport=http``).

Start the server with ``--worker-extension-cls ardea_weights.WeightUpload`` and this
file's folder on its ``PYTHONPATH`` (a launched server gets both). vLLM mixes the class
into its worker, so the trainer's ``POST /collective_rpc`` with ``{"method":
"ardea_load_weights", "kwargs": {"data": <base64 of a safetensors file>}}`` (dev mode,
``VLLM_SERVER_DEV_MODE=1``) reaches :meth:`WeightUpload.ardea_load_weights` in every
worker, which loads the tensors in place as ``reload_weights`` does from a path. Only the
standard library and safetensors (which vLLM's environment has) are imported here.
"""

from __future__ import annotations

import base64

from safetensors.torch import load


class WeightUpload:
    """Mixed into vLLM's worker (``self.model_runner`` is the worker's)."""

    def ardea_load_weights(self, data: str) -> int:
        """Load the safetensors file ``data`` (base64) in place; the number of tensors."""
        tensors = load(base64.b64decode(data))
        self.model_runner.reload_weights(weights_iterator=list(tensors.items()))
        return len(tensors)

"""How a policy version's full weights reach the vLLM servers
(``rollout.vllm.weight_transport``): the one place a transport is defined.

A transport answers three questions the engine asks (:class:`WeightTransport`):

- what a launched server needs to take it (``server_setup``: flags and environment; a
  server you start needs the same);
- what happens once per sync on the trainer's side (``write``: here the weights become one
  safetensors file in the model directory, ``<run>/engine/weights``; it returns the bytes
  a sync moves, ``vllm/sync_bytes``);
- the request that has one server load them (``reload``: a ``POST /collective_rpc``),
  with ``hint`` added to that request's error.

``file``: every server reloads the file from its path (vLLM's ``reload_weights``): they must
see the trainer's directory. ``http``: the file's bytes travel in the request itself, loaded
by ardea's worker extension (:mod:`ardea.rollout.engines.vllm.extension.ardea_weights`): no
shared disk. A GPU transport over NCCL fits the same place: ``server_setup`` the servers'
flags, ``write`` the bucketed broadcast on rank 0's device instead of a file, ``reload``
vLLM's ``/update_weights`` with the tensors' names, dtypes and shapes (between its
``/start_weight_update`` and ``/finish_weight_update``); it is not built, because every
weight-transfer backend of vLLM 0.32 needs CUDA (docs/howto/vllm.md).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ardea.rollout.engines.vllm.extension import FOLDER, WORKER_EXTENSION
from ardea.rollout.engines.vllm.weights import WEIGHTS_FILE, write_weights

Reload = tuple[str, dict[str, Any]]  # (route, JSON body) of one server's reload request


class WeightTransport:
    """``rollout.vllm.weight_transport=file`` (module docstring), the base of the others.

    Args:
        weights_dir: the model directory the servers start from, where ``write`` puts the
            weights file.
    """

    name = "file"
    hint = ""

    def __init__(self, weights_dir: Path) -> None:
        self.weights_dir = Path(weights_dir)

    def server_setup(self) -> tuple[list[str], dict[str, str]]:
        """The flags and environment a launched server needs for this transport."""
        return [], {}

    def write(self, tensors: Mapping[str, torch.Tensor]) -> int:
        """The trainer's side of a sync: ``tensors`` written; the bytes a sync moves."""
        return write_weights(self.weights_dir, tensors).stat().st_size

    def reload(self) -> Reload:
        """The request that has one server load what :meth:`write` wrote."""
        path = str(self.weights_dir.resolve())
        return "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}}


class HttpTransport(WeightTransport):
    """``rollout.vllm.weight_transport=http``: the weights file's bytes in the request."""

    name = "http"
    hint = (
        f"(rollout.vllm.weight_transport=http: start the server with --worker-extension-cls "
        f"{WORKER_EXTENSION} and {FOLDER} on its PYTHONPATH)"
    )

    def server_setup(self) -> tuple[list[str], dict[str, str]]:
        path = os.pathsep.join(filter(None, [str(FOLDER), os.environ.get("PYTHONPATH")]))
        return ["--worker-extension-cls", WORKER_EXTENSION], {"PYTHONPATH": path}

    def reload(self) -> Reload:
        data = base64.b64encode((self.weights_dir / WEIGHTS_FILE).read_bytes()).decode()
        return "/collective_rpc", {"method": "ardea_load_weights", "kwargs": {"data": data}}


#: by name: the choices of ``rollout.vllm.weight_transport`` (``WEIGHT_TRANSPORTS``)
TRANSPORTS = {transport.name: transport for transport in (WeightTransport, HttpTransport)}


def weight_transport(name: str, weights_dir: Path) -> WeightTransport:
    """The transport ``rollout.vllm.weight_transport=<name>`` (a name the config checked)."""
    return TRANSPORTS[name](weights_dir)

"""``TinkerServer``: the Tinker-compatible API on a port, in a background thread.

>>> with TinkerServer({"tiny": "/models/tiny"}, state_dir="tinker-state") as server:
...     client = tinker.ServiceClient(base_url=server.url, api_key="tml-local")

Base models are local directories, each served under a name (and under its own path, so
``base_model="/models/tiny"`` works too). Saved states and sampler weights go to
``state_dir`` (see :mod:`ardea.service.tinker_store`) and outlive the server. ``device``:
where training and sampling run (``cpu``, ``cuda``, ``cuda:1``, ``auto``); ``dtype`` and
``compute_dtype``: the parameters' dtype and the one forwards compute in (ardea's
``model.dtype`` and ``model.compute_dtype``; ``auto``, the default of ``ardea serve
--tinker``, measures, so float32 is the default here: what a script computes does not
depend on the machine or its load). ``engine``: the
``rollout.engine`` samplers decode on (``in_process``, ``vllm``), ``engine_options`` its
options (``rollout.vllm``'s fields for vllm; see :mod:`ardea.service.tinker_engines`).
``limits``: the
shared HTTP layer's (:class:`~ardea.agent.http_guard.ServerLimits`: API key, body size —
64 MiB by default here —, requests in flight); ``work``: what requests may ask
(:class:`~ardea.service.tinker_fields.TinkerLimits`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ardea.agent.http_guard import ServerLimits
from ardea.agent.server import AppServer
from ardea.service.tinker_app import build_app, error_body
from ardea.service.tinker_fields import TinkerLimits
from ardea.service.tinker_service import TinkerService
from ardea.service.tinker_wire import PROTOBUF

MAX_BODY_BYTES = 64 * 2**20  # forward_backward bodies: the SDK sends chunks of ~5 MB
BODY_TYPES = {"/api/v1/forward_backward": (PROTOBUF,)}


def tinker_limits(api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
                  max_in_flight: int = 256) -> ServerLimits:  # fmt: skip
    """The HTTP layer's limits for a Tinker server (protobuf where the SDK sends it); the
    server adds the protobuf route to any limits it is given."""
    return ServerLimits(max_body_bytes=max_body_bytes, max_in_flight=max_in_flight,
                        api_key=api_key)  # fmt: skip


class TinkerServer(AppServer):
    def __init__(
        self,
        bases: dict[str, str | Path],
        *,
        state_dir: str | Path,
        host: str = "127.0.0.1",
        port: int = 0,
        samplers: int = 3,
        device: str = "cpu",
        limits: ServerLimits | None = None,
        work: TinkerLimits | None = None,
        engine: str = "in_process",
        engine_options: dict[str, Any] | None = None,
        dtype: str = "float32",
        compute_dtype: str = "float32",
    ) -> None:
        bases = {name: Path(path) for name, path in bases.items()}
        self.service = TinkerService(
            bases, Path(state_dir), samplers=samplers, device=device, limits=work,
            engine=engine, engine_options=engine_options, dtype=dtype, compute_dtype=compute_dtype,
        )  # fmt: skip
        super().__init__(build_app(self.service), host=host, port=port, name="Tinker server",
                         limits=replace(limits or tinker_limits(), body_types=BODY_TYPES),
                         error_body=error_body)  # fmt: skip

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        super().stop()
        self.service.close()

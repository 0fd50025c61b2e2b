"""``TinkerServer``: the Tinker-compatible API on a port, in a background thread.

>>> with TinkerServer({"tiny": "/models/tiny"}, state_dir="tinker-state") as server:
...     client = tinker.ServiceClient(base_url=server.url, api_key="tml-local")

Base models are local directories, each served under a name (and under its own path, so
``base_model="/models/tiny"`` works too). Saved states and sampler weights go to
``state_dir`` (see :mod:`ardea.service.tinker_store`) and outlive the server. ``device``:
where training and sampling run (``cpu``, ``cuda``, ``cuda:1``, ``auto``).
"""

from __future__ import annotations

from pathlib import Path

from ardea.agent.server import AppServer
from ardea.service.tinker_app import build_app
from ardea.service.tinker_service import TinkerService


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
    ) -> None:
        bases = {name: Path(path) for name, path in bases.items()}
        self.service = TinkerService(bases, Path(state_dir), samplers=samplers, device=device)
        super().__init__(build_app(self.service), host=host, port=port, name="Tinker server")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        super().stop()
        self.service.close()

"""One real vLLM server (vLLM's CPU build in .venv-vllm, scripts/setup_vllm_venv.sh) for the
vLLM tests: started once per session on a tiny model whose attention heads vLLM's CPU kernels
support (head dim 32), stopped at the end. Engines in the tests connect to it with
rollout.vllm.urls and load their own weights into it first."""

from __future__ import annotations

import pytest
from vllm_testing import start_server


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """The session's server (:func:`vllm_testing.start_server`: it logs its requests)."""
    server = start_server(tmp_path_factory.mktemp("vllm"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def vllm_url(vllm_server):
    return vllm_server.url

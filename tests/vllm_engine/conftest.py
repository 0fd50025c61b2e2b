"""One real vLLM server (vLLM's CPU build in .venv-vllm, scripts/setup_vllm_venv.sh) for the
vLLM tests: started once per session on a tiny model whose attention heads vLLM's CPU kernels
support (head dim 32), stopped at the end. Engines in the tests connect to it with
rollout.vllm.urls and load their own weights into it first."""

from __future__ import annotations

import pytest
from vllm_testing import PYTHON, write_model_dir

from ardea.rollout.vllm_server import LaunchedServer


@pytest.fixture(scope="session")
def vllm_url(tmp_path_factory):
    if not PYTHON.is_file():
        pytest.fail(f"{PYTHON} is missing: `make test` builds it (scripts/setup_vllm_venv.sh)")
    root = tmp_path_factory.mktemp("vllm")
    server = LaunchedServer(
        str(PYTHON), write_model_dir(root / "model"), root / "server.log", dtype="float32",
        max_model_len=256, extra_args=[], startup_timeout_s=600.0,
    )  # fmt: skip
    url = server.start()
    yield url
    server.stop()

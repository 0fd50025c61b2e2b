"""The servers a run starts (``rollout.vllm.launch=true``): all at once, each in its own
process with its own log (``<run>/engine/server<i>.log``), on the weights just written."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ardea.rollout.engines.vllm.pool import PoolServer
from ardea.rollout.engines.vllm.server import LaunchedServer
from ardea.rollout.engines.vllm.transports import WeightTransport
from ardea.rollout.engines.vllm.weights import LORA_ENV, AdapterSync


def launch_servers(
    options: Any,
    spec: Any,
    transport: WeightTransport,
    *,
    dtype: str,
    lora: AdapterSync | None,
) -> list[PoolServer]:
    """``options.servers`` servers (``rollout.vllm``) on the model in the transport's
    ``weights_dir`` (``spec``: the engine's, for the context length and the log
    directory), in ``dtype``, set up for ``transport``; ``lora``: servers that take the
    adapter at runtime. When one does not start, those that did are stopped and its error
    raised."""
    count = options.servers
    length = options.max_model_len or int(
        getattr(spec.model_config, "max_position_embeddings", 0) or 2048
    )
    extension, env = transport.server_setup()
    if lora is not None:  # the adapter's path instead (AdapterSync refuses http)
        extension, env = lora.server_args(), dict(LORA_ENV)
    launched = [
        LaunchedServer(
            options.python,
            transport.weights_dir,
            Path(spec.work_dir) / ("server.log" if count == 1 else f"server{i}.log"),
            dtype=dtype,
            max_model_len=length,
            extra_args=[*options.server_args, *extension],
            startup_timeout_s=options.startup_timeout_s,
            env=env,
        )
        for i in range(count)
    ]
    try:
        with ThreadPoolExecutor(max_workers=count) as threads:
            urls = list(threads.map(LaunchedServer.start, launched))
    except BaseException:  # one did not start: stop those that did
        for server in launched:
            server.stop()
        raise
    return [PoolServer(i, url, server) for i, (url, server) in enumerate(zip(urls, launched))]

"""The ``rollout.vllm`` section: generation on vLLM servers (``rollout.engine=vllm``)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ardea.config.fields import check_choices, check_range, option
from ardea.errors import ConfigError

WEIGHT_TRANSPORTS = ("file", "http")


@dataclass
class VLLMConfig:
    urls: list[str] = option(
        help="Base URLs of vLLM OpenAI-compatible servers the user started (e.g. "
        "http://127.0.0.1:8000); several = data-parallel inference, requests spread over "
        "them. Empty with launch=true: ardea starts one. Start them with "
        "VLLM_SERVER_DEV_MODE=1 and --logprobs-mode processed_logprobs (weight reloads and "
        "behaviour log-probs of the distribution sampled from need both).",
        factory=list,
    )
    launch: bool = option(
        False,
        "Start vLLM servers for the run (`servers` of them; 127.0.0.1, free ports, their logs "
        "in the run directory under engine/), stopped with the run and restarted with the "
        "current weights if they die (up to max_restarts each).",
    )
    servers: int = option(
        1,
        "launch=true: how many servers to start. Several are a pool: requests spread by "
        "load, every call of one episode on one server, a server that dies taken out and "
        "its requests run on the others.",
    )
    weight_transport: str = option(
        "file",
        "How new weights reach the servers after each step: 'file' (one safetensors file in "
        "the run directory, reloaded by every server: they must see that path) or 'http' (the "
        "file's bytes in the reload request itself: no shared disk; a server you start needs "
        "--worker-extension-cls ardea_weights.WeightUpload with ardea's vllm_extension folder "
        "on its PYTHONPATH, a launched one gets both).",
        choices=WEIGHT_TRANSPORTS,
    )
    python: str = option(
        ".venv-vllm/bin/python",
        "The Python of the environment vLLM is installed in (scripts/setup_vllm_venv.sh).",
    )
    timeout_s: float = option(
        120.0,
        "Seconds one request (a generation or a weight reload) may take before the run fails "
        "with an error naming the server and the call.",
    )
    startup_timeout_s: float = option(600.0, "Seconds a launched server may take to start.")
    max_restarts: int = option(2, "launch=true: most restarts of a server that died.")
    max_model_len: int = option(
        0, "The server's --max-model-len (0 = the model's max_position_embeddings)."
    )
    server_args: list[str] = option(
        help="Extra command-line flags of a launched server (e.g. [--max-num-seqs, '64']).",
        factory=list,
    )
    sync_tolerance: float = option(
        1e-3,
        "After every weight reload the servers' log-probs of a fixed probe completion must "
        "equal the trainer's within this (max |difference|); above it the run fails rather "
        "than drift silently. 0 = no probe.",
    )

    def __post_init__(self) -> None:
        check_choices(self, "rollout.vllm")
        if not isinstance(self.urls, list) or not all(
            isinstance(u, str) and u.startswith(("http://", "https://")) for u in self.urls
        ):
            raise ConfigError(
                f"rollout.vllm.urls={self.urls!r} must be a list of http(s):// base URLs"
            )
        check_range("rollout.vllm.timeout_s", self.timeout_s, low=0.0, low_open=True)
        check_range("rollout.vllm.startup_timeout_s", self.startup_timeout_s, low=0.0, low_open=True)  # fmt: skip
        check_range("rollout.vllm.max_restarts", self.max_restarts, low=0)
        check_range("rollout.vllm.servers", self.servers, low=1)
        if self.servers > 1 and not self.launch:
            raise ConfigError(
                f"rollout.vllm.servers={self.servers} starts servers only with "
                "rollout.vllm.launch=true; list the servers you started in rollout.vllm.urls"
            )
        check_range("rollout.vllm.max_model_len", self.max_model_len, low=0)
        check_range("rollout.vllm.sync_tolerance", self.sync_tolerance, low=0.0)

    def changed(self) -> list[str]:
        """The options set away from their defaults (an error unless the engine is vllm)."""
        default = VLLMConfig()
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)]

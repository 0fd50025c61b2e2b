"""A vLLM OpenAI-compatible server started and stopped by ardea (``rollout.vllm.launch``).

The server runs in its own Python environment (``rollout.vllm.python``, built by
``scripts/setup_vllm_venv.sh``: vLLM pins its own transformers), bound to 127.0.0.1 on a
free port, with ``VLLM_SERVER_DEV_MODE=1`` (for ``/collective_rpc`` weight reloads and
``/server_info``) and ``--logprobs-mode processed_logprobs`` (behaviour log-probs of the
distribution sampled from, after temperature and top-k/top-p). Its output goes to a log file
whose tail is quoted in every error. It is started in a process group of its own and
stopped with the whole group (vLLM starts worker processes).
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from ardea.errors import ArdeaError

#: extra arguments that spread a server over several devices (it then keeps its workers)
PARALLEL_FLAGS = ("--tensor-parallel", "-tp", "--pipeline-parallel", "-pp", "--data-parallel",
                  "-dp")  # fmt: skip
#: flags every launched server gets (see the module docstring)
SERVER_FLAGS = ("--enforce-eager", "--logprobs-mode", "processed_logprobs", "--seed", "0")


class VLLMServerError(ArdeaError):
    """A vLLM server could not be started, stopped answering, or died."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: an exception's last line in a log ("... ValueError: ..."), after vLLM's line prefix
EXCEPTION_LINE = re.compile(r"(?:^|\s)((?:[A-Za-z_][\w.]*)?(?:Error|Exception)(?::| \d).*)$")


def log_tail(path: Path, lines: int = 15, errors: int = 6) -> str:
    """The exceptions a server logged (their last lines, each once: the root cause of a
    failed start is often far above the log's end), then its last ``lines`` lines."""
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    found: list[str] = []
    for line in text:
        match = EXCEPTION_LINE.search(line)
        if match and match.group(1) not in found and "Warning" not in match.group(1):
            found.append(match.group(1))
    head = (
        ("exceptions logged:\n  " + "\n  ".join(found[:errors]) + "\nlast lines:\n")
        if found
        else ""
    )
    return head + "\n".join(text[-lines:])


class LaunchedServer:
    """One server process on ``model_dir`` (see the module docstring).

    Args:
        python: the interpreter of vLLM's environment.
        model_dir: a Hugging Face model directory (config, tokenizer, safetensors weights).
        log_path: where the server's output goes.
        dtype: ``--dtype`` (the trainer's parameter dtype).
        max_model_len: ``--max-model-len``.
        extra_args: more flags (``rollout.vllm.server_args``).
        startup_timeout_s: how long :meth:`start` waits for ``/health``.
        env: more environment variables of the server process.
    """

    def __init__(
        self,
        python: str,
        model_dir: Path,
        log_path: Path,
        *,
        dtype: str,
        max_model_len: int,
        extra_args: list[str],
        startup_timeout_s: float,
        env: dict[str, str] | None = None,
    ) -> None:
        if not Path(python).is_file():
            raise VLLMServerError(
                f"rollout.vllm.python={python!r} does not exist; build vLLM's environment "
                "with scripts/setup_vllm_venv.sh or point it at a Python that has vllm"
            )
        self.python, self.model_dir, self.log_path = python, Path(model_dir), Path(log_path)
        self.dtype, self.max_model_len, self.extra_args = dtype, max_model_len, list(extra_args)
        self.startup_timeout_s = startup_timeout_s
        self.env = dict(env or {})
        self.process: subprocess.Popen | None = None
        self.url = ""

    def command(self, port: int) -> list[str]:
        return [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", "ardea",
            "--host", "127.0.0.1", "--port", str(port), "--dtype", self.dtype,
            "--max-model-len", str(self.max_model_len), *SERVER_FLAGS, *self.extra_args,
        ]  # fmt: skip

    def start(self) -> str:
        """Start the server and wait until it answers ``/health``; its base URL."""
        port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)  # its own session: it would outlive an interpreter that exits
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
        if not any(a.startswith(PARALLEL_FLAGS) for a in self.extra_args):
            # one device: the model runs in vLLM's engine process instead of a worker
            # process of its own, one interpreter start (~7 s on a CPU) fewer per server
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env.update(self.env)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(port), stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise VLLMServerError(
                    f"the vLLM server on {self.model_dir} exited with code "
                    f"{self.process.returncode} while starting; its log {self.log_path} ends:\n"
                    f"{log_tail(self.log_path)}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=5.0).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise VLLMServerError(
            f"the vLLM server at {self.url} did not answer /health within "
            f"{self.startup_timeout_s:.0f} s (rollout.vllm.startup_timeout_s); its log "
            f"{self.log_path} ends:\n{log_tail(self.log_path)}"
        )

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """Stop the server's whole process group (SIGTERM, then SIGKILL after 20 s)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


def check_servers(urls: list[str], request: Callable[..., Any]) -> int | None:
    """Every server at ``urls`` serves ``ardea`` in processed-logprobs mode, all with one
    context length (``request(url, path, body, call)`` asks one); that length, or None
    when no server reports it. Each failure is a :class:`VLLMServerError` naming the server."""
    lengths = {}
    for url in urls:
        info = request(url, "/server_info?config_format=json", None, "the logprobs-mode check")
        mode = info.get("vllm_config", {}).get("model_config", {}).get("logprobs_mode")
        if mode != "processed_logprobs":
            raise VLLMServerError(
                f"the vLLM server {url} does not report --logprobs-mode processed_logprobs; "
                "its behaviour log-probs would not describe the distribution it samples "
                "from. Start it with --logprobs-mode processed_logprobs (and "
                "VLLM_SERVER_DEV_MODE=1 for weight reloads)"
            )
        models = request(url, "/v1/models", None, "the model check")
        names = [m.get("id") for m in models["data"]]
        if "ardea" not in names:
            raise VLLMServerError(
                f"the vLLM server {url} serves {names}, not the model 'ardea' this run's "
                "requests name: start it with --served-model-name ardea"
            )
        for model in models["data"]:  # a LoRA adapter is listed too, without a length
            if model.get("max_model_len") is not None:
                lengths[url] = int(model["max_model_len"])
    if len(set(lengths.values())) > 1:
        raise VLLMServerError(
            "the vLLM servers of rollout.vllm.urls serve different context lengths "
            f"({', '.join(f'{u}: {n}' for u, n in lengths.items())}); start them with one "
            "--max-model-len"
        )
    return min(lengths.values()) if lengths else None

"""Helpers of the vLLM tests: the tiny model they serve, engines on the session server,
and log-probs recomputed without ardea's code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ardea.model import build_char_tokenizer, build_tiny_model
from ardea.rollout import EngineSpec, make_engine

PYTHON = Path(__file__).parents[2] / ".venv-vllm" / "bin" / "python"
TOKENIZER = build_char_tokenizer(model_max_length=256)
#: head dim 64 / 2 = 32 (vLLM's CPU attention has no kernel for 16)
SIZE = dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
#: the same model as a run's overrides
SIZE_OVERRIDES = [f"model.{k}={v}" for k, v in SIZE.items()]


def tiny(seed: int = 0, **changes):
    return build_tiny_model(TOKENIZER, **{**SIZE, **changes}, seed=seed).float().eval()


def write_model_dir(path: Path) -> Path:
    model = tiny()
    model.save_pretrained(path)
    TOKENIZER.save_pretrained(path)
    return path


#: a server that logs every request's prompt token ids (DEBUG), read by the pool tests, and
#: takes LoRA adapters at runtime (the LoRA tests load theirs into it instead of launching one)
LOG_REQUESTS = (
    ["--enable-log-requests", "--enable-lora", "--max-lora-rank", "8", "--max-loras", "1"],
    {"VLLM_LOGGING_LEVEL": "DEBUG", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
)
PROMPT_IDS = re.compile(r"prompt_token_ids: \[([0-9, ]*)\]")


def start_server(root: Path, *, max_model_len: int = 256):
    """A real vLLM server on the tiny model (in ``root``), logging its requests; started."""
    from ardea.rollout.engines.vllm.server import LaunchedServer

    if not PYTHON.is_file():
        pytest.fail(f"{PYTHON} is missing: `make test` builds it (scripts/setup_vllm_venv.sh)")
    args, env = LOG_REQUESTS
    server = LaunchedServer(
        str(PYTHON), write_model_dir(root / "model"), root / "server.log", dtype="float32",
        max_model_len=max_model_len, extra_args=args, startup_timeout_s=600.0, env=env,
    )  # fmt: skip
    server.start()
    return server


def logged_prompts(server, start: int = 0) -> list[tuple[int, ...]]:
    """The prompts (token ids) ``server`` logged after byte ``start`` of its log."""
    with open(server.log_path, "rb") as log:
        log.seek(start)
        text = log.read().decode(errors="replace")
    return [tuple(int(t) for t in m.group(1).split(", ") if t) for m in PROMPT_IDS.finditer(text)]


def engine_on(url: str, model, work_dir: Path, **options):
    """A vllm engine on the server at ``url`` generating with ``model``'s weights."""
    spec = EngineSpec.of(
        model, TOKENIZER, options={"urls": [url], "timeout_s": 60.0, "sync_tolerance": 1e-4, **options},
        work_dir=work_dir,
    )  # fmt: skip
    return make_engine("vllm", spec, module=model)


@torch.no_grad()
def recomputed(model, prompt: list[int], tokens: list[int], temperature: float = 1.0):
    """``(T,)`` float64 log-probs of ``tokens`` after ``prompt`` from one full forward."""
    ids = torch.tensor([prompt + tokens])
    logits = model(input_ids=ids).logits.double()[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]


@torch.no_grad()
def hf_greedy(model, prompt: list[int], steps: int, stops: list[int]) -> list[int]:
    """Greedy tokens by plain argmax decoding (full forwards, no cache)."""
    out = list(prompt)
    for _ in range(steps):
        token = int(model(input_ids=torch.tensor([out])).logits[0, -1].argmax())
        out.append(token)
        if token in stops:
            break
    return out[len(prompt) :]

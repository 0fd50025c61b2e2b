"""Generation on a vLLM server (vLLM's CPU build, .venv-vllm) against ardea's in-process engine,
and the seconds a weight sync takes, at three model sizes.

Models (Qwen2 decoders, random init, float32, the character tokenizer's 262-token vocabulary;
head dim 32 or 64: vLLM's CPU attention has no kernel for 16):

- ``0.1M``: hidden 64, intermediate 128, 2 layers, 2 heads, 1 KV head (the vLLM tests');
- ``3M``: hidden 256, intermediate 768, 4 layers, 4 heads, 2 KV heads;
- ``10M``: hidden 384, intermediate 1152, 6 layers, 6 heads, 2 KV heads.

Per size: ``--prompts`` prompts of 6-12 tokens, ``--group`` samples each at T = 1, exactly
``--new-tokens`` new tokens (no stop ids), the same seeded call on both engines; tokens/s is
generated tokens over the call's wall time, best of ``--repeats`` after one warm-up call, and
the ratio vLLM / in-process is taken over adjacent pairs (median). The server is launched by
the engine (``rollout.vllm.launch``) and its start-up time reported.

Weight sync: seconds of ``update_weights`` with a new state dict, the sync probe off, median
of ``--repeats`` per transport, the transports alternating:

- ``state dict``: the in-process engine on its own copy of the model (the trainer's tensors
  copied in, as a background worker's or a torchrun owner's engine gets them), timed before
  the server starts;
- ``file`` (``rollout.vllm.weight_transport=file``): one safetensors file written to the
  run directory, reloaded by the server from that path, its prefix cache reset;
- ``http`` (``weight_transport=http``): the same file's bytes sent in the reload request
  (base64 in JSON), loaded from memory by ardea's worker extension (the server is launched
  with it; the ``file`` transport does not use it).

    python benchmarks/bench_vllm.py                  # the table in benchmarks/README.md
    python benchmarks/bench_vllm.py --smoke          # one size, a few tokens (starts a server)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ardea.model import build_char_tokenizer, build_tiny_model
from ardea.rollout import EngineSpec, SamplingParams, make_engine, own_copy

SIZES = {
    "0.1M": dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1),
    "3M": dict(hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4, num_kv_heads=2),
    "10M": dict(hidden_size=384, intermediate_size=1152, num_layers=6, num_heads=6, num_kv_heads=2),
}
PYTHON = Path(__file__).parents[1] / ".venv-vllm" / "bin" / "python"


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def prompts(tokenizer, count: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(count):
        a, b = torch.randint(0, 1000, (2,), generator=gen).tolist()
        out.append(tokenizer(f"{a}+{b}=")["input_ids"])
    return out


def bench(size: str, args, work: Path) -> dict:
    tokenizer = build_char_tokenizer(model_max_length=256)
    model = build_tiny_model(tokenizer, **SIZES[size], seed=0).float().eval()
    params = SamplingParams(
        temperature=1.0, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
        n=args.group, seed=1,
    )  # fmt: skip
    batch = prompts(tokenizer, args.prompts)
    tokens = len(batch) * args.group * args.new_tokens
    local = make_engine("in_process", EngineSpec.of(model, tokenizer), module=own_copy(model))
    # before the server starts: its process would share the 2 cores with these copies
    syncs = sync_times(model, local, args.repeats, ("state_dict",))
    # no sync probe: the update times below are the reload alone (runs add one probe)
    options = {"launch": True, "python": str(PYTHON), "max_model_len": 256, "timeout_s": 600.0,
               "sync_tolerance": 0.0, "weight_transport": "http"}  # fmt: skip
    spec = EngineSpec.of(model, tokenizer, options=options, work_dir=work / size)
    start = time.perf_counter()
    server = make_engine("vllm", spec, module=model)
    startup = time.perf_counter() - start
    try:
        for engine in (local, server):
            engine.generate(batch, params)  # warm-up
        pairs = [
            (tokens / timed(lambda: local.generate(batch, params)),
             tokens / timed(lambda: server.generate(batch, params)))
            for _ in range(args.repeats)
        ]  # fmt: skip
        syncs |= sync_times(model, server, args.repeats, ("file", "http"))
    finally:
        server.close()
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    return {
        "size": size,
        "parameters_m": round(params_m, 2),
        "rows": len(batch) * args.group,
        "new_tokens": args.new_tokens,
        "in_process_tok_s": max(p[0] for p in pairs),
        "vllm_tok_s": max(p[1] for p in pairs),
        "ratio_vllm_over_in_process": statistics.median(p[1] / p[0] for p in pairs),
        "server_startup_s": startup,
    } | {f"sync_{t}_s": statistics.median(v) for t, v in syncs.items()}


def sync_times(model, engine, repeats: int, transports: tuple[str, ...]) -> dict[str, list[float]]:
    """Seconds of each ``update_weights`` of ``engine`` per transport (module docstring),
    the transports alternating; the model's weights change before every sync."""
    times: dict[str, list[float]] = {t: [] for t in transports}
    for _ in range(repeats):
        for transport, seconds in times.items():
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1.001)
            state = model.state_dict()
            if transport != "state_dict":
                engine.options.weight_transport = transport  # the server has the extension
            start = time.perf_counter()
            engine.update_weights(state, engine.version + 1)
            seconds.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument("--smoke", action="store_true", help="0.1M only, 4 x 2 rows, 4 tokens")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.smoke:
        args.sizes, args.prompts, args.group, args.new_tokens, args.repeats = ["0.1M"], 4, 2, 4, 1
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for size in args.sizes:
            row = bench(size, args, Path(work))
            print(json.dumps(row))
            rows.append(row)
    print("| model | rows x new tokens | in-process tok/s | vLLM tok/s | vLLM / in-process | "
          "server start s |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']} ({r['parameters_m']}M) | {r['rows']} x {r['new_tokens']} | "
              f"{r['in_process_tok_s']:.0f} | {r['vllm_tok_s']:.0f} | "
              f"{r['ratio_vllm_over_in_process']:.2f}x | {r['server_startup_s']:.0f} |")  # fmt: skip
    print("\n| model | sync: state dict (in process) s | file (vLLM) s | http (vLLM) s | "
          "http / file |")  # fmt: skip
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']} ({r['parameters_m']}M) | {r['sync_state_dict_s']:.4f} | "
              f"{r['sync_file_s']:.3f} | {r['sync_http_s']:.3f} | "
              f"{r['sync_http_s'] / r['sync_file_s']:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()

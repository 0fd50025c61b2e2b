"""A LoRA policy's weight sync to a vLLM server (vLLM's CPU build, .venv-vllm): the adapter
alone against the merged full weights, at three model sizes and two ranks.

Models: ``bench_vllm.py``'s (0.1M, 3M, 10M; Qwen2 decoders, float32), LoRA through peft on
``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (ardea's default target modules) at rank 8
and 16, ``lora_alpha = 2 r``. Per size and rank one server is launched by the LoRA engine
(``--enable-lora --max-lora-rank r``); a second engine without LoRA talks to the same server.
Each round changes the adapter, then, alternating which goes first:

- ``merged``: the adapter merged into the model's weights in place (``merge_adapter``), the
  full state dict written and reloaded by the server (``rollout.vllm.weight_transport=file``),
  the adapter unmerged again (``unmerge_adapter``; as verl syncs a LoRA policy), then one
  greedy token requested; "merge alone" is the merge and unmerge;
- ``adapter``: ardea's LoRA sync (``update_weights`` of the LoRA engine: the adapter written
  alone and loaded in place through ``/v1/load_lora_adapter``), then one greedy token
  requested under the adapter (vLLM loads an adapter into its worker on first use).

The sync probe is off on both (``sync_tolerance: 0``; runs add one probe to either). Reported:
bytes written per sync, the median seconds of each path over ``--repeats`` rounds and the
paired ratio merged / adapter (median).

In process, before the server starts: an in-process engine on its own copy of the policy
(as a background worker's or a torchrun owner's engine has) takes ``update_weights`` of the
whole state dict (every tensor copied) or of the adapter alone (what ardea's trainer sends a
LoRA policy's engines), alternating, median seconds of ``--repeats`` after one warm-up.

    python benchmarks/bench_lora_sync.py            # the table in benchmarks/README.md
    python benchmarks/bench_lora_sync.py --smoke    # 0.1M, rank 8, one round (starts a server)
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from bench_vllm import PYTHON, SIZES

from ardea.model import build_char_tokenizer, build_tiny_model
from ardea.model.lora import apply_lora
from ardea.rollout import EngineSpec, SamplingParams, make_engine, own_copy

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
ONE_TOKEN = SamplingParams(temperature=0.0, max_new_tokens=1)


def engines(size: str, rank: int, work: Path):
    """The LoRA policy, its engine (which launches the server) and a plain engine on the
    same server."""
    tokenizer = build_char_tokenizer(model_max_length=256)
    model = build_tiny_model(tokenizer, **SIZES[size], seed=0).float().eval()
    policy = apply_lora(model, r=rank, alpha=2 * rank, dropout=0.0, target_modules=TARGETS)
    options = {"python": str(PYTHON), "max_model_len": 256, "timeout_s": 600.0,
               "sync_tolerance": 0.0}  # fmt: skip
    spec = EngineSpec.of(policy, tokenizer, options={**options, "launch": True},
                         work_dir=work / f"{size}_r{rank}_lora")  # fmt: skip
    lora = make_engine("vllm", spec, module=policy)
    merged = copy.deepcopy(policy).merge_and_unload()
    spec = EngineSpec.of(merged, tokenizer, options={**options, "urls": lora.urls},
                         work_dir=work / f"{size}_r{rank}_merged")  # fmt: skip
    plain = make_engine("vllm", spec, module=merged)
    return policy, lora, plain, tokenizer("1+1=")["input_ids"]


def in_process_times(size: str, rank: int, repeats: int) -> dict[str, float]:
    """Median seconds of an own-copy in-process engine's sync, whole state dict against
    the adapter alone (module docstring)."""
    tokenizer = build_char_tokenizer(model_max_length=256)
    model = build_tiny_model(tokenizer, **SIZES[size], seed=0).float().eval()
    policy = apply_lora(model, r=rank, alpha=2 * rank, dropout=0.0, target_modules=TARGETS)
    engine = make_engine("in_process", EngineSpec.of(policy, tokenizer), module=own_copy(policy))
    states = {
        "in_process_full_s": policy.state_dict(),
        "in_process_adapter_s": {k: v for k, v in policy.state_dict().items() if "lora_" in k},
    }
    times: dict[str, list[float]] = {name: [] for name in states}
    for round_ in range(repeats + 1):
        for name, state in states.items() if round_ % 2 else reversed(states.items()):
            start = time.perf_counter()
            engine.update_weights(state, engine.version + 1)
            if round_:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def bench(size: str, rank: int, repeats: int, work: Path) -> dict:
    local = in_process_times(size, rank, repeats)  # before the server shares the cores
    policy, lora, plain, prompt = engines(size, rank, work)
    times: dict[str, list[float]] = {"merged": [], "adapter": [], "merge_only": []}
    sizes: dict[str, int] = {}

    def merged_sync() -> None:
        start = time.perf_counter()
        policy.merge_adapter()  # in place, as verl merges before a sync
        merging = time.perf_counter() - start
        base = policy.get_base_model().state_dict()
        state = {k.replace(".base_layer.", "."): v for k, v in base.items() if "lora_" not in k}
        plain.update_weights(state, plain.version + 1)
        unmerge = time.perf_counter()
        policy.unmerge_adapter()
        times["merge_only"].append(merging + time.perf_counter() - unmerge)
        plain.generate([prompt], ONE_TOKEN)
        times["merged"].append(time.perf_counter() - start)
        sizes["merged"] = int(plain.metrics()["vllm/sync_bytes"])

    def adapter_sync() -> None:
        start = time.perf_counter()
        lora.update_weights(policy.state_dict(), lora.version + 1)
        lora.generate([prompt], ONE_TOKEN)
        times["adapter"].append(time.perf_counter() - start)
        sizes["adapter"] = int(lora.metrics()["vllm/sync_bytes"])

    try:
        for round_ in range(repeats + 1):  # the first round warms both paths up
            with torch.no_grad():
                for name, p in policy.named_parameters():
                    if "lora_" in name:
                        p.add_(0.01)
            for sync in (merged_sync, adapter_sync) if round_ % 2 else (adapter_sync, merged_sync):
                sync()
            if round_ == 0:
                times = {k: [] for k in times}
    finally:
        plain.close()
        lora.close()
    return {
        "size": size,
        "rank": rank,
        "parameters_m": round(sum(p.numel() for p in policy.parameters()) / 1e6, 2),
        "merged_bytes": sizes["merged"],
        "adapter_bytes": sizes["adapter"],
        "merged_s": statistics.median(times["merged"]),
        "merge_only_s": statistics.median(times["merge_only"]),
        "adapter_s": statistics.median(times["adapter"]),
        "merged_over_adapter": statistics.median(
            m / a for m, a in zip(times["merged"], times["adapter"])
        ),
    } | local


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--ranks", nargs="+", type=int, default=[8, 16])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="0.1M, rank 8, one round")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.ranks, args.repeats = ["0.1M"], [8], 1
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for size in args.sizes:
            for rank in args.ranks:
                row = bench(size, rank, args.repeats, Path(work))
                print(json.dumps(row), flush=True)
                rows.append(row)
    print("| model | rank | bytes: merged / adapter | merged sync s (merge + unmerge) | "
          "adapter sync s | merged / adapter |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']} ({r['parameters_m']}M) | {r['rank']} | "
              f"{r['merged_bytes'] / 1e6:.2f} MB / {r['adapter_bytes'] / 1e6:.3f} MB | "
              f"{r['merged_s']:.3f} ({r['merge_only_s']:.3f}) | {r['adapter_s']:.3f} | "
              f"{r['merged_over_adapter']:.1f}x |")  # fmt: skip
    print("\n| model | rank | in-process sync s: whole state dict | adapter alone | ratio |")
    print("|---|---|---|---|---|")
    for r in rows:
        full, adapter = r["in_process_full_s"], r["in_process_adapter_s"]
        print(f"| {r['size']} ({r['parameters_m']}M) | {r['rank']} | {full:.4f} | "
              f"{adapter:.4f} | {full / adapter:.1f}x |")  # fmt: skip


if __name__ == "__main__":
    main()

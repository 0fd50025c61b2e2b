"""bfloat16 against float32 compute on this CPU: the figures behind ``model.compute_dtype=auto``.

    python benchmarks/bench_compute_dtype.py            # one thread, 5 rounds
    python benchmarks/bench_compute_dtype.py --smoke    # seconds
    python benchmarks/bench_compute_dtype.py --probe-only   # the probes alone (seconds)

First ``compute_dtype=auto``'s probe (:func:`ardea.model.dtype_probe.measure`, uncached) at
the shapes of three runs: the default recipe's RL step and the two GRPO benchmark models.

Two measurements, each alternating fp32 and bf16 over ``--repeats`` rounds (best time of
each side is reported):

- square ``torch.matmul`` at n = 64, 256, 1024 in float32 and in bfloat16 (GFLOP/s, 2n³
  FLOPs per product; the GRPO comparison's ``matmul_peak``: 3 products per timing);
- a training pass (forward, backward, AdamW step) of the default recipe's tiny model
  (ardea's character tokenizer, hidden 64, 2 layers: what ``ardea train`` trains) on a
  batch of 64 × 48 tokens, fp32 parameters, plain or under ``torch.autocast("cpu",
  torch.bfloat16)`` with the eager attention kernel (what ardea runs at this length in bf16).

It prints the CPU's capability flags (AMX tiles, AVX-512 BF16), what ``auto`` resolves to
here (ardea's probe at the training pass's shapes: the rates it measured) and the bf16 /
fp32 time ratio of each case: above 1 bf16 is slower. A JSON line holds every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import torch
from grpo_workload import matmul_peak

from ardea.model import Precision, build_char_tokenizer, build_tiny_model
from ardea.model.dtype_probe import FORCE_ENV, ProbeShapes, measure


def training_pass(bf16: bool, batch: int, seq: int):
    """A closure running one pass of a fresh tiny model (same seed for both sides)."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
        intermediate_size=192, seed=0,
    )  # fmt: skip
    model.config._attn_implementation = "eager" if bf16 else "sdpa"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(3, len(tokenizer), (batch, seq), generator=torch.Generator().manual_seed(0))

    def run() -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss)

    return run


PROBES = {  # compute_dtype=auto's probe at the shapes of three runs
    "default recipe RL (hidden 64)": ProbeShapes(64, 192, train_tokens=256 * 16, decode_rows=256),
    "GRPO benchmark 3M (hidden 256)": ProbeShapes(256, 768, train_tokens=64 * 70, decode_rows=64),
    "GRPO benchmark 10M (hidden 384)": ProbeShapes(384, 1152, train_tokens=64 * 56, decode_rows=64),
}


def probe_row(name: str, shapes: ProbeShapes) -> dict:
    """A fresh (uncached) probe at ``shapes``: its rates, choice and wall time."""
    start = time.perf_counter()
    result = measure(torch.device("cpu"), torch.float32, [torch.float32, torch.bfloat16], shapes)
    return {"case": name, "seconds": time.perf_counter() - start, **dataclasses.asdict(result)}


def print_probes(probes: list[dict]) -> None:
    print(
        "| shapes | fp32 GFLOP/s (training / decode) | bf16 GFLOP/s (training / decode) | auto | probe time |"
    )
    print("|---|---|---|---|---|")
    for row in probes:
        train, decode = row["train_gflops"], row["decode_gflops"]
        bf16 = "not timed" if train["bfloat16"] is None else f"{train['bfloat16']:.1f}"
        print(f"| {row['case']} | {train['float32']:.1f} / {decode['float32']:.1f} | {bf16} / "
              f"{decode['bfloat16']:.1f} | {row['choice']} | {row['seconds']:.2f} s |")  # fmt: skip


def seconds_of(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="small sizes, 2 rounds")
    parser.add_argument("--probe-only", action="store_true", help="only the probes (seconds)")
    args = parser.parse_args()
    if os.environ.pop(FORCE_ENV, None):  # what auto measures is this benchmark's subject
        print(f"[bench] {FORCE_ENV} ignored: auto measures here", flush=True)
    torch.set_num_threads(args.threads)
    repeats = 2 if args.smoke else args.repeats
    sizes = (64,) if args.smoke else (64, 256, 1024)
    batch, seq = (4, 16) if args.smoke else (64, 48)
    flags = {
        "amx_tiles": bool(torch.cpu._is_amx_tile_supported()),
        "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
    }
    shapes = ProbeShapes(hidden=64, intermediate=192, train_tokens=batch * seq, decode_rows=batch)
    measured = Precision.resolve("auto", torch.device("cpu"), torch.float32, shapes=shapes)
    auto = measured.compute
    probes = [probe_row(name, shapes) for name, shapes in PROBES.items()]
    print_probes(probes)
    if args.probe_only:
        return
    rows = []
    for n in sizes:
        gflops = {"fp32": 0.0, "bf16": 0.0}
        for _ in range(repeats):
            for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
                gflops[name] = max(gflops[name], matmul_peak(dtype, n, repeats=1))
        seconds = {k: 2 * n**3 / v / 1e9 for k, v in gflops.items()}
        rows.append({"case": f"matmul n={n}", **seconds, "gflops": gflops})
    passes = {"fp32": training_pass(False, batch, seq), "bf16": training_pass(True, batch, seq)}
    for run in passes.values():
        run()  # warm-up
    seconds = {"fp32": float("inf"), "bf16": float("inf")}
    for _ in range(repeats):
        for name, run in passes.items():
            seconds[name] = min(seconds[name], seconds_of(run))
    rows.append({"case": f"tiny-model training pass {batch}x{seq}", **seconds})
    probe = dataclasses.asdict(measured.probe)
    print(json.dumps({"flags": flags, "auto": str(auto), "probe": probe, "threads": args.threads,
                      "rows": rows, "probes": probes}))  # fmt: skip
    print(f"CPU: AMX tiles {flags['amx_tiles']}, AVX-512 BF16 {flags['avx512_bf16']}; "
          f"{measured.probe.describe()}")  # fmt: skip
    print("| case | fp32 | bf16 | bf16 / fp32 time |")
    print("|---|---|---|---|")
    for row in rows:
        if "gflops" in row:
            cells = f"{row['gflops']['fp32']:.1f} GFLOP/s | {row['gflops']['bf16']:.1f} GFLOP/s"
        else:
            cells = f"{row['fp32'] * 1e3:.1f} ms | {row['bf16'] * 1e3:.1f} ms"
        print(f"| {row['case']} | {cells} | {row['bf16'] / row['fp32']:.2f} |")


if __name__ == "__main__":
    main()

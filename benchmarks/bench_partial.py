"""The long tail of generation, and partial rollouts off against on.

**Engine** (``--engine in_process vllm``): ``--steps`` steps of ``--rows`` rows each, on a
3M Qwen2 decoder (random init, float32, the character tokenizer; vLLM: the CPU build's
server launched by the engine). Lengths have a long tail: every ``--every``-th row of a step
generates ``--long`` tokens, the others ``--short`` (``min_new_tokens = max_new_tokens``, so
lengths are exact and equal on both sides). Two schedules of the same rows:

- ``batch``: a step's rows are submitted together and the next step starts when all of them
  are done, so every step waits for its slowest rows;
- ``continuous``: the next step's rows are submitted as soon as the short rows of this one
  are done, and join the running long rows (what partial rollouts let the background
  worker do).

Per engine and schedule: wall seconds, generated tokens per second, and for ``batch`` the
seconds spent waiting on the tail (from the step's last short row to its last long row).

**Training** (``--train``): the default recipe (SFT, then online GRPO) with background
rollouts (``stages.rl.rollout.max_staleness=1``), once with ``rollout.partial=false`` and
once with ``true``, the same seeds: wall seconds of the RL stage, the share of completions
an update reached, and the RL stage's held-out accuracy at its evaluations (does
off-policyness hurt?).

    python benchmarks/bench_partial.py --train      # the tables in benchmarks/README.md
    python benchmarks/bench_partial.py --smoke      # seconds: tiny sizes, in process only
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ardea.model import build_char_tokenizer, build_tiny_model
from ardea.rollout import EngineSpec, Request, SamplingParams, make_engine

REPO = Path(__file__).parents[1]
ARDEA = str(Path(sys.executable).parent / "ardea")
PYTHON = REPO / ".venv-vllm" / "bin" / "python"
SIZE = dict(hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4, num_kv_heads=2)
SMOKE_SIZE = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1)


def step_requests(tokenizer, step: int, args) -> list[tuple[Request, bool]]:
    """The rows of ``step``: (request, whether it is a long one)."""
    gen = torch.Generator().manual_seed(step)
    out = []
    for i in range(args.rows):
        a, b = torch.randint(0, 1000, (2,), generator=gen).tolist()
        long = i % args.every == 0
        n = args.long if long else args.short
        params = SamplingParams(temperature=1.0, max_new_tokens=n, min_new_tokens=n, seed=step)
        out.append((Request(tokenizer(f"{a}+{b}=")["input_ids"], params, i), long))
    return out


def schedule(engine, tokenizer, args, continuous: bool) -> dict:
    """Run every step's rows (module docstring); seconds, tokens/s and the tail's wait."""
    start, tail, tokens, running = time.perf_counter(), 0.0, 0, []
    for step in range(args.steps):
        rows = [
            (engine.submit(request), long) for request, long in step_requests(tokenizer, step, args)
        ]
        for handle, long in rows:
            if not long:
                tokens += len(handle.result().token_ids)
        short_done = time.perf_counter()
        if continuous:  # the next step starts now; the long rows finish beside it
            running += [h for h, long in rows if long]
            continue
        tokens += sum(len(h.result().token_ids) for h, long in rows if long)
        tail += time.perf_counter() - short_done
    tokens += sum(len(h.result().token_ids) for h in running)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens_per_s": tokens / seconds, "tail_s": tail}


def bench_engine(name: str, args, work: Path) -> dict:
    tokenizer = build_char_tokenizer(model_max_length=256)
    model = (
        build_tiny_model(tokenizer, **(SMOKE_SIZE if args.smoke else SIZE), seed=0).float().eval()
    )
    options = {}
    if name == "vllm":
        options = {"launch": True, "python": str(PYTHON), "max_model_len": 256,
                   "timeout_s": 600.0, "sync_tolerance": 0.0}  # fmt: skip
    spec = EngineSpec.of(model, tokenizer, options=options, work_dir=work / name)
    engine = make_engine(name, spec, module=model)
    try:
        schedule(engine, tokenizer, args, continuous=False)  # warm-up
        row = {"engine": name}
        for _ in range(args.repeats):  # alternating, best of each
            for mode in ("batch", "continuous"):
                got = schedule(engine, tokenizer, args, continuous=mode == "continuous")
                if mode not in row or got["seconds"] < row[mode]["seconds"]:
                    row[mode] = got
        row["speedup"] = row["batch"]["seconds"] / row["continuous"]["seconds"]
        return row
    finally:
        engine.close()


def train(partial: bool, args, work: Path) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"partial_{partial}_", dir=work))
    overrides = ["stages.rl.rollout.max_staleness=1", f"stages.rl.rollout.partial={str(partial).lower()}",
                 "logging.progress=false", "logging.tensorboard=false", f"trainer.output_dir={out}"]  # fmt: skip
    if args.smoke:
        overrides += ["stages.sft.trainer.max_steps=2", "stages.rl.trainer.max_steps=2",
                      "data.eval_size=8", "stages.rl.trainer.eval_every=1"]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run([ARDEA, "train", *overrides], cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stdout[-2000:] + done.stderr[-4000:])
    lines = (out / "rl" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    rollouts = [r for r in records if "rollout/resumed_fraction" in r]
    rl = json.loads((out / "rl" / "results.json").read_text())
    return {
        "partial": partial,
        "seconds": time.perf_counter() - start,
        "rl_seconds_per_step": rl["profile"]["seconds_per_step"],
        "resumed_fraction": sum(r["rollout/resumed_fraction"] for r in rollouts) / len(rollouts),
        "accuracy": [(r["step"], r["eval/accuracy"]) for r in records if "eval/accuracy" in r],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", nargs="+", default=["in_process", "vllm"],
                        choices=["in_process", "vllm"])  # fmt: skip
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--every", type=int, default=8)
    parser.add_argument("--short", type=int, default=24)
    parser.add_argument("--long", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--train", action="store_true", help="also the default recipe, off/on")
    parser.add_argument("--smoke", action="store_true", help="seconds: tiny sizes, in process")
    args = parser.parse_args()
    if args.smoke:
        args.engine, args.steps, args.rows, args.every = ["in_process"], 2, 8, 4
        args.short, args.long, args.repeats = 4, 12, 1
    print(
        f"# {platform.processor() or platform.machine()}, torch threads {torch.get_num_threads()}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        engines = [bench_engine(name, args, Path(tmp)) for name in args.engine]
        runs = (
            [train(p, args, Path(tmp)) for p in (False, True)] if args.train or args.smoke else []
        )
    for row in engines + runs:
        print(json.dumps(row))
    print(
        "| engine | batch s | batch tokens/s | tail wait s | continuous s | continuous tokens/s | batch / continuous |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in engines:
        b, c = r["batch"], r["continuous"]
        print(f"| {r['engine']} | {b['seconds']:.2f} | {b['tokens_per_s']:.0f} | {b['tail_s']:.2f} | "
              f"{c['seconds']:.2f} | {c['tokens_per_s']:.0f} | {r['speedup']:.2f}x |")  # fmt: skip
    if runs:
        print(
            "| rollout.partial | wall s | RL s/step | resumed | held-out accuracy (RL step: value) |"
        )
        print("|---|---|---|---|---|")
        for r in runs:
            curve = ", ".join(f"{s}: {a:.3f}" for s, a in r["accuracy"])
            print(f"| {str(r['partial']).lower()} | {r['seconds']:.0f} | {r['rl_seconds_per_step']:.3f} | "
                  f"{r['resumed_fraction']:.2f} | {curve} |")  # fmt: skip


if __name__ == "__main__":
    main()

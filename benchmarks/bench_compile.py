"""Would compiling pay here? ardea's decode step and training forward + backward, eager
against ``torch.compile`` (inductor), side by side in one process.

    python benchmarks/bench_compile.py                   # 3M and 10M workloads, 1 thread
    python benchmarks/bench_compile.py --workloads 3M --cache-dir /tmp/inductor   # warm cache
    python benchmarks/bench_compile.py --smoke           # seconds: tiny model, eager backend

The work is the GRPO benchmark's (:mod:`grpo_workload`: ``prompts × group`` completions of
``new_tokens`` forced tokens after a 2- or 3-digit addition prompt):

- **decode**: the in-process engine generates the rollout with its compact decode step
  (:class:`ardea.rollout.engines.inprocess.fast_decode.FastDecoder`) as it is, and with the step compiled with
  dynamic shapes (rows leave the batch as they finish, the KV cache grows). Both sides run
  the engine's batch loop under ``torch.no_grad``: under ``torch.inference_mode``, where
  ``generate`` runs it, torch 2.13's compiler rejects the step's inputs ("Cannot set
  version_counter for inference tensor"), so a compiled engine would have to leave it too.
- **train**: :func:`ardea.model.sequence_logprobs` over the rollout's ``N × (P + R)`` tokens
  and the backward of their sum, the backbone as it is and compiled (static shapes).

The compiled side's first call (compile + run) is timed on its own; the inductor cache is a
fresh temporary directory (a cold start, every run) unless ``--cache-dir`` names one (run
twice for the warm figure). Then both sides alternate over ``--repeats`` rounds; the table
gives each side's median and the median of the paired ratios eager / compiled (above 1 the
compiled side is faster), and how far the outputs differ (max |Δ log-prob|). A JSON line per
workload holds every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
from grpo_workload import SMOKE, WORKLOADS, Workload, build_model

from ardea.model import sequence_logprobs
from ardea.rollout.engine import SamplingParams
from ardea.rollout.engines.inprocess.engine import InProcessEngine


def build(work: Workload):
    tokenizer, model = build_model(work)
    low = 10 ** (work.digits - 1)
    prompts = [
        tokenizer(f"{low + 7 * i}+{low + 3 * i}=", add_special_tokens=False)["input_ids"]
        for i in range(work.prompts)
    ]
    return tokenizer, model, prompts


def decode_sides(work: Workload, tokenizer, model, prompts, backend: str):
    """``(eager, compiled)`` closures generating the rollout; each returns its log-probs."""
    engine = InProcessEngine(
        model, pad_token_id=tokenizer.pad_token_id, eos_token_ids=tokenizer.eos_token_id
    )
    fast = engine._fast
    eager_step = fast.step
    compiled = torch.compile(type(fast).step.__wrapped__, dynamic=True, backend=backend)
    params = SamplingParams(
        temperature=1.0, max_new_tokens=work.new_tokens, min_new_tokens=work.new_tokens,
        n=work.group, seed=0,
    )  # fmt: skip

    def side(step):
        def run() -> torch.Tensor:
            fast.step = step
            with torch.no_grad():
                completions = engine.generate(prompts, params)
            return torch.tensor([lp for c in completions for lp in c.logprobs])

        return run

    return side(eager_step), side(lambda *args, **kw: compiled(fast, *args, **kw))


def train_sides(work: Workload, model, prompts, backend: str):
    """``(eager, compiled)`` closures: log-probs of the rollout's tokens and their backward."""
    model.requires_grad_(True)
    width = max(map(len, prompts)) + work.new_tokens
    n = work.prompts * work.group
    ids = torch.randint(3, 40, (n, width), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    backbone = model.model
    compiled = torch.compile(backbone, dynamic=False, backend=backend)

    def side(module):
        def run() -> torch.Tensor:
            model.model = module
            out = sequence_logprobs(model, ids, mask)
            out.logprobs.sum().backward()
            model.zero_grad(set_to_none=True)
            model.model = backbone
            return out.logprobs.detach()

        return run

    return side(backbone), side(compiled)


def compare(eager, compiled, repeats: int) -> dict:
    """First compiled call timed alone, then alternating rounds; medians and paired ratios."""
    reference = eager()
    start = time.perf_counter()
    first = compiled()
    compile_s = time.perf_counter() - start
    times = {"eager": [], "compiled": []}
    for _ in range(repeats):
        for name, run in (("eager", eager), ("compiled", compiled)):
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    ratios = [e / c for e, c in zip(times["eager"], times["compiled"], strict=True)]
    return {
        "compile_and_first_s": round(compile_s, 2),
        "eager_s": round(statistics.median(times["eager"]), 4),
        "compiled_s": round(statistics.median(times["compiled"]), 4),
        "ratio": round(statistics.median(ratios), 3),
        "ratios": [round(r, 3) for r in ratios],
        "max_abs_logprob_diff": float((first - reference).abs().max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache-dir", help="inductor cache (default: a fresh temporary one)")
    parser.add_argument("--smoke", action="store_true", help="tiny model, eager backend, 1 round")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workloads = [SMOKE] if args.smoke else [WORKLOADS[name] for name in args.workloads]
    backend = "eager" if args.smoke else "inductor"  # smoke: graph capture only, no C++
    repeats = 1 if args.smoke else args.repeats
    with tempfile.TemporaryDirectory() as fresh:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = args.cache_dir or fresh
        print(
            f"# torch {torch.__version__}, {args.threads} thread(s), backend {backend}, inductor "
            f"cache {'given' if args.cache_dir else 'fresh (cold start)'}"
        )
        print("| workload | part | compile + first (s) | eager (s) | compiled (s) | eager / "
              "compiled | max |Δ log-prob| |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for work in workloads:
            tokenizer, model, prompts = build(work)
            row = {"workload": work.name, "threads": args.threads, "backend": backend}
            row["decode"] = compare(
                *decode_sides(work, tokenizer, model, prompts, backend), repeats
            )
            row["train"] = compare(*train_sides(work, model, prompts, backend), repeats)
            for part in ("decode", "train"):
                r = row[part]
                print(
                    f"| {work.name} | {part} | {r['compile_and_first_s']:.1f} | "
                    f"{r['eager_s']:.3f} | {r['compiled_s']:.3f} | {r['ratio']:.2f} | "
                    f"{r['max_abs_logprob_diff']:.1e} |"
                )
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

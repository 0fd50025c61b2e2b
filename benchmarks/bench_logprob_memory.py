"""Peak memory of ardea's log-prob function against a naive full-vocabulary log-softmax,
forward + backward, on CPU.

- **ardea**: ``ardea.model.sequence_logprobs(model, input_ids, attention_mask)`` (the backbone
  once, then the LM head and the float32 log-softmax over ``chunk_size`` = 1024 positions at a
  time, each chunk checkpointed so the backward recomputes one chunk's logits at a time);
- **naive**: ``torch.log_softmax(model(input_ids, attention_mask).logits.float(), -1)``
  gathered at the next tokens (the full ``[N, S, V]`` logits and log-softmax exist, and their
  gradients in the backward).

Both then take ``loss = -mean(log-probs over the scored positions)`` and ``loss.backward()``.
Workload: a Qwen2 (hidden 256, intermediate 768, 2 layers, 4 heads, 2 KV heads, untied LM
head, ``max_position_embeddings`` 2048, fp32, random init, seed 0), vocabulary ``--vocab``
(32,000), ``--batch`` × ``--seq`` (8 × 2048) random tokens, no padding.

Method: each method runs in a fresh subprocess (so one's freed memory never serves the
other), which builds the model and the inputs, runs one warm-up forward + backward on a
single short row (so one-off allocations such as thread pools and kernels are not counted),
frees its gradients, resets the kernel's peak-RSS mark to the current RSS (``5`` into
``/proc/self/clear_refs``), reads its resident set size (``/proc/self/statm``) as the
baseline, runs the measured forward + backward once, and reports the peak RSS since the reset
(``VmHWM`` of ``/proc/self/status``) minus the baseline: the memory the method added at its
peak, as the operating system saw it (resident pages; torch's CPU allocator keeps no peak
statistics of its own, and ``ru_maxrss`` cannot be reset, so it would include the imports'
peak; it is the fallback, reported as ``peak_source``, where ``clear_refs`` is not
writable). Also checked, in the ardea worker after its measurement, at a smaller shape (2 ×
256 tokens, same vocabulary): the two give the same log-probs (max |difference| ≤ 1e-5) and
the same gradients. Only the workers import torch. Target: ardea's peak ≤ ¼ of the naive one.

    python benchmarks/bench_logprob_memory.py --threads 1   # the table in benchmarks/README.md
    python benchmarks/bench_logprob_memory.py --batch 4      # 4 × 2048
    python benchmarks/bench_logprob_memory.py --smoke        # seconds: vocab 1k, 2 × 128
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

METHODS = ("ardea", "naive")
PAGE = os.sysconf("SC_PAGE_SIZE")


def build(vocab: int, seq: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max(2048, seq),
        tie_word_embeddings=False,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).float().train()


def inputs(vocab: int, batch: int, seq: int):
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    return ids, torch.ones_like(ids)


def logprobs(method: str, model, ids, mask):
    """``(N, S - 1)`` next-token log-probs of ``ids`` by ``method`` (module docstring)."""
    import torch

    from ardea.model import sequence_logprobs

    if method == "ardea":
        return sequence_logprobs(model, ids, mask).logprobs[:, :-1]
    logits = model(input_ids=ids, attention_mask=mask).logits
    full = torch.log_softmax(logits.float(), dim=-1)  # (N, S, V)
    return full[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)


def forward_backward(method: str, model, ids, mask) -> float:
    loss = -logprobs(method, model, ids, mask).mean()
    loss.backward()
    return float(loss.detach())


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def reset_peak() -> str:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux >= 4.0: ``5`` into
    ``/proc/self/clear_refs``); returns where the peak is read from afterwards."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return "ru_maxrss"  # peak since the process started (includes imports)
    return "VmHWM"


def peak_bytes(source: str) -> int:
    if source == "VmHWM":
        with open("/proc/self/status") as f:
            line = next(x for x in f if x.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def worker(method: str, vocab: int, batch: int, seq: int) -> dict:
    """In a fresh process: the memory ``method``'s forward + backward adds (module docstring)."""
    model = build(vocab, seq)
    ids, mask = inputs(vocab, batch, seq)
    forward_backward(method, model, ids[:1, :16], mask[:1, :16])  # warm-up: one-off allocations
    model.zero_grad(set_to_none=True)
    source = reset_peak()
    baseline = rss_bytes()
    start = time.perf_counter()
    loss = forward_backward(method, model, ids, mask)
    seconds = time.perf_counter() - start
    peak = peak_bytes(source)
    return {
        "method": method, "vocab": vocab, "batch": batch, "seq": seq, "loss": loss,
        "baseline_rss_mib": baseline / 2**20, "peak_rss_mib": peak / 2**20,
        "added_mib": (peak - baseline) / 2**20, "peak_source": source, "seconds": seconds,
    }  # fmt: skip


def run_worker(method: str, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", method, "--vocab", str(args.vocab),
           "--batch", str(args.batch), "--seq", str(args.seq), "--threads", str(args.threads)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{method} worker failed:\n{done.stdout}{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def agreement(vocab: int, batch: int, seq: int) -> dict:
    """Max |difference| of the two methods' log-probs and gradients at one shape."""
    model = build(vocab, seq)
    ids, mask = inputs(vocab, batch, seq)
    out = {}
    for method in METHODS:
        model.zero_grad(set_to_none=True)
        lp = logprobs(method, model, ids, mask)
        lp.mean().backward()
        out[method] = (lp.detach(), [p.grad.clone() for p in model.parameters()])
    (lp_a, g_a), (lp_n, g_n) = out["ardea"], out["naive"]
    lp_diff = float((lp_a - lp_n).abs().max())
    grad_diff = max(float((a - n).abs().max()) for a, n in zip(g_a, g_n, strict=True))
    return {"check_shape": [batch, seq], "logprob_max_diff": lp_diff, "grad_max_diff": grad_diff,
            "logprobs_agree": lp_diff <= 1e-5}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--smoke", action="store_true", help="vocab 1k, 2 × 128, one thread")
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.vocab, args.batch, args.seq, args.threads = 1000, 2, 128, 1
    if args.worker:  # torch is imported here only: the parent stays light
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        row = worker(args.worker, args.vocab, args.batch, args.seq)
        if args.worker == "ardea":  # after the measurement: the check's memory is not counted
            row["check"] = agreement(args.vocab, 2, min(args.seq, 256))
        row["torch"], row["threads"] = torch.__version__, torch.get_num_threads()
        print(json.dumps(row))
        return
    rows = {method: run_worker(method, args) for method in METHODS}
    check = rows["ardea"].pop("check")
    print(
        f"# torch {rows['ardea']['torch']}, threads {rows['ardea']['threads']}, "
        f"{platform.processor() or platform.machine()}; vocab {args.vocab}, "
        f"{args.batch} × {args.seq} tokens"
    )
    print(json.dumps(check))
    for row in rows.values():
        print(json.dumps(row))
    ardea, naive = rows["ardea"], rows["naive"]
    summary = {"ardea_added_mib": ardea["added_mib"], "naive_added_mib": naive["added_mib"],
               "ratio": ardea["added_mib"] / naive["added_mib"],
               "loss_diff": abs(ardea["loss"] - naive["loss"]), **check}  # fmt: skip
    print(json.dumps(summary))
    full = args.batch * args.seq * args.vocab * 4 / 2**20
    print(f"\none float32 [N, S, V] tensor: {full:,.0f} MiB")
    print("| method | baseline RSS MiB | peak RSS MiB | added at peak MiB | s | loss |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows.values():
        print(f"| {r['method']} | {r['baseline_rss_mib']:,.0f} | {r['peak_rss_mib']:,.0f} | "
              f"{r['added_mib']:,.0f} | {r['seconds']:.2f} | {r['loss']:.6f} |")  # fmt: skip
    print(
        f"\nardea / naive: {summary['ratio']:.3f}; log-probs max |diff| "
        f"{check['logprob_max_diff']:.1e}, gradients {check['grad_max_diff']:.1e} "
        f"(at {check['check_shape'][0]} × {check['check_shape'][1]})"
    )


if __name__ == "__main__":
    main()

"""Training pass: ardea's SFT update against a minimal hand-written PyTorch loop over the
same tokens, and the attention kernels of a bf16 forward + backward on CPU.

Table 1, the pass (forward, backward, optimizer step) on one fixed SFT batch:

- **ardea**: a :class:`ardea.trainer.Trainer` built from an ``ardea train`` config
  (``algo.name=sft``, ardea's tiny Qwen2 built in code: hidden 256, intermediate 768, 4
  layers, 4 heads, 2 KV heads, ardea's character tokenizer; AdamW lr 1e-5 constant, no weight
  decay, gradient clipping at 1.0), its own collated batch of ``--batch`` prompt/completion
  records of exactly ``--seq`` tokens (half prompt, half completion + eos: the loss is on the
  completion), one pass = ``trainer.updater.run([[batch]], PhaseTimer())``, what a step of
  ``ardea train`` runs after collating (token-mean cross-entropy from the chunked log-probs
  of :func:`ardea.model.sequence_logprobs`, ``clip_grad_norm_``, AdamW, ``zero_grad``, the
  schedule step);
- **hand loop**: a deep copy of the same initial model and its own ``torch.optim.AdamW``
  (same hyperparameters): ``model(input_ids, attention_mask).logits``, ``cross_entropy`` on
  the next tokens, mean over the completion positions, ``backward``, ``clip_grad_norm_(1.0)``,
  ``step``, ``zero_grad(set_to_none=True)``.

Cases: ``fp32`` (``model.compute_dtype=float32``; the hand loop in plain fp32), ``bf16``
(``model.compute_dtype=auto``, bf16 autocast on this CPU, with ardea's attention rule
``model.attn_implementation=auto``; the hand loop under ``torch.autocast("cpu",
torch.bfloat16)`` with the model's default ``sdpa`` kernel), and ``bf16+sdpa`` (the same with
``model.attn_implementation=sdpa``, the hand loop's kernel: not ardea's default at 256
tokens, it separates the kernel from the rest of ardea's pass). The work is the same: the first
pass of each side starts from identical weights and their losses must agree (fp32: within
1e-5; bf16: the difference is reported, kernels and rounding differ). Timing: 2 warm-up passes
per side, then ``--repeats`` rounds of one ardea pass and one hand pass (alternating which goes
first); median seconds per pass per side, ardea's overhead = median(ardea) / median(hand) − 1
and the median of the per-round ratios (the JSON lines also hold every pass's time and each
side's best). Target: overhead ≤ 10 %.

Table 2, attention kernels: a bf16-autocast forward + backward (the hand loop's loss, no
optimizer) of the same model at sequence lengths ``--attn-lengths`` (64 … 512) with the batch
chosen so every length has the same number of tokens (``--attn-tokens``, 4096), ``sdpa`` vs
``eager`` (``model.set_attn_implementation``), alternating over ``--repeats`` rounds: the
figures behind ardea's ``model.attn_implementation=auto`` (eager up to
``EAGER_MAX_TOKENS`` tokens in 16-bit compute on CPU).

One JSON line per measured case, then the tables.

    python benchmarks/bench_train_pass.py --threads 1   # the tables in benchmarks/README.md
    python benchmarks/bench_train_pass.py --cases fp32 --repeats 3 --attn-lengths  # no table 2
    python benchmarks/bench_train_pass.py --smoke       # seconds: tiny model, 2 × 32 tokens
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
import torch.nn.functional as F

from ardea.config import load_config
from ardea.model.precision import EAGER_MAX_TOKENS
from ardea.trainer import Trainer
from ardea.trainer.step.updates import PhaseTimer

# case: (model.compute_dtype, model.attn_implementation)
CASES = {"fp32": ("float32", "auto"), "bf16": ("auto", "auto"), "bf16+sdpa": ("auto", "sdpa")}
SHAPE = {"hidden_size": 256, "intermediate_size": 768, "num_layers": 4, "num_heads": 4,
         "num_kv_heads": 2}  # fmt: skip
SMOKE_SHAPE = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 2,
               "num_kv_heads": 1}  # fmt: skip
LR = 1e-5


def write_records(path: Path, n: int, seq: int) -> None:
    """``n`` prompt/completion records of exactly ``seq`` tokens with ardea's character
    tokenizer (one token per character, eos after the completion)."""
    g = torch.Generator().manual_seed(0)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789+-=*/ "
    half = seq // 2
    with path.open("w") as f:
        for _ in range(n):
            chars = [alphabet[i] for i in torch.randint(len(alphabet), (seq - 1,), generator=g)]
            text = "".join(chars)
            f.write(json.dumps({"prompt": text[:half], "completion": text[half:]}) + "\n")


def make_trainer(root: Path, case: str, shape: dict, batch: int, seq: int) -> Trainer:
    """The trainer ``ardea train`` builds for this SFT config (module docstring)."""
    compute_dtype, attention = CASES[case]
    data = root / "sft.jsonl"
    if not data.exists():
        write_records(data, batch, seq)
    config = {
        "model": {**shape, "max_position_embeddings": max(256, seq), "dtype": "float32",
                  "compute_dtype": compute_dtype, "attn_implementation": attention},
        "data": {"task": None, "path": str(data)},
        "algo": {"name": "sft"},
        "trainer": {
            "output_dir": str(root / f"run-{case}"), "max_steps": 1000,
            "batch_size": batch, "lr": LR, "lr_schedule": "constant", "warmup_steps": 0,
            "weight_decay": 0.0, "max_grad_norm": 1.0, "eval_every": 0, "save_every": 0,
            "seed": 0, "device": "cpu",
        },
        "logging": {"progress": False, "tensorboard": False},
    }  # fmt: skip
    path = root / f"config-{case}.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return Trainer(load_config(path))


def hand_loss(model, input_ids, attention_mask, loss_mask) -> torch.Tensor:
    """Mean next-token cross-entropy over the positions whose next token is trained."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    mask = loss_mask[:, 1:]
    nll = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1),
        reduction="none",
    ).view_as(mask)  # fmt: skip
    return (nll * mask).sum() / mask.sum()


def hand_pass_fn(model, batch, bf16: bool):
    """One hand-written pass (module docstring); returns its loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), weight_decay=0)
    inputs = (batch.input_ids, batch.attention_mask, batch.loss_mask)

    def run() -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = hand_loss(model, *inputs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return run


def alternate(fns: dict, repeats: int, warmup: int) -> tuple[dict[str, list[float]], dict]:
    """Seconds of each of ``fns`` over ``repeats`` rounds (the first alternates between
    rounds) after ``warmup`` calls each; also each's results in call order."""
    results: dict[str, list] = {name: [] for name in fns}
    for _ in range(warmup):
        for name, fn in fns.items():
            results[name].append(fn())
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            results[name].append(fns[name]())
            times[name].append(time.perf_counter() - start)
    return times, results


def train_pass_case(root: Path, case: str, shape: dict, args) -> dict:
    trainer = make_trainer(root, case, shape, args.batch, args.seq)
    batch = trainer.strategy.collate(trainer.train_samples[: args.batch]).to(trainer.device)
    assert tuple(batch.input_ids.shape) == (args.batch, args.seq), batch.input_ids.shape
    trainer.policy.train()
    hand_model = copy.deepcopy(trainer.policy).train()  # identical initial weights

    def ardea_pass() -> float:
        return trainer.updater.run([[batch]], PhaseTimer())["train/loss"]

    fns = {"ardea": ardea_pass, "hand": hand_pass_fn(hand_model, batch, case != "fp32")}
    times, losses = alternate(fns, args.repeats, args.warmup)
    a, h = statistics.median(times["ardea"]), statistics.median(times["hand"])
    diff = abs(losses["ardea"][0] - losses["hand"][0])
    n_params = sum(p.numel() for p in trainer.policy.parameters())
    return {
        "table": "train_pass", "case": case, "params": n_params, "batch": args.batch,
        "seq": args.seq, "compute_dtype": str(trainer.precision.compute).removeprefix("torch."),
        "ardea_s": a, "hand_s": h, "overhead_pct": 100 * (a / h - 1),
        "ardea_best_s": min(times["ardea"]), "hand_best_s": min(times["hand"]),
        "paired_overhead_pct": 100 * (statistics.median(
            x / y for x, y in zip(times["ardea"], times["hand"], strict=True)) - 1),
        "first_loss_ardea": losses["ardea"][0], "first_loss_hand": losses["hand"][0],
        "loss_diff": diff, "losses_agree": diff <= 1e-5 if case == "fp32" else None,
        "attn_implementation": trainer.precision.attention_for(args.seq) or "model's own",
        "ardea_times": times["ardea"], "hand_times": times["hand"],
    }  # fmt: skip


def attention_case(model, seq: int, tokens: int, args) -> dict:
    n = max(1, tokens // seq)
    g = torch.Generator().manual_seed(seq)
    ids = torch.randint(1, model.config.vocab_size, (n, seq), generator=g)
    ones = torch.ones_like(ids)

    def pass_with(kernel: str):
        def run() -> None:
            model.set_attn_implementation(kernel)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = hand_loss(model, ids, ones, ones)
            loss.backward()
            model.zero_grad(set_to_none=True)

        return run

    times, _ = alternate({"sdpa": pass_with("sdpa"), "eager": pass_with("eager")},
                         args.repeats, args.warmup)  # fmt: skip
    s, e = statistics.median(times["sdpa"]), statistics.median(times["eager"])
    return {"table": "attention", "seq": seq, "batch": n, "sdpa_s": s, "eager_s": e,
            "eager_vs_sdpa_pct": 100 * (e / s - 1),
            "faster": "eager" if e < s else "sdpa"}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--attn-lengths", type=int, nargs="*", default=[64, 128, 256, 512])
    parser.add_argument("--attn-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 2 × 32, 1 round")
    args = parser.parse_args()
    shape = SHAPE
    if args.smoke:
        shape, args.batch, args.seq, args.repeats, args.warmup = SMOKE_SHAPE, 2, 32, 1, 1
        args.attn_lengths, args.attn_tokens = [16, 32], 64
        args.threads = args.threads or 1
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"# torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"{platform.processor() or platform.machine()}; model {shape}"
    )
    passes, kernels = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            row = train_pass_case(Path(tmp), case, shape, args)
            print(json.dumps(row), flush=True)
            passes.append(row)
        trainer = make_trainer(Path(tmp), "fp32", shape, args.batch, args.seq)
        model = trainer.policy.train()
        for seq in args.attn_lengths:
            model.config.max_position_embeddings = max(model.config.max_position_embeddings, seq)
            row = attention_case(model, seq, args.attn_tokens, args)
            print(json.dumps(row), flush=True)
            kernels.append(row)
    print("\n| case | attention (ardea) | params | batch × seq | ardea s/pass | hand loop s/pass | ardea overhead "
          "(paired) | first loss ardea / hand | |diff| |")  # fmt: skip
    print("|---|---|---:|---|---:|---:|---:|---|---:|")
    for r in passes:
        print(
            f"| {r['case']} | {r['attn_implementation']} | {r['params'] / 1e6:.2f}M | {r['batch']} × {r['seq']} | "
            f"{r['ardea_s']:.3f} | {r['hand_s']:.3f} | {r['overhead_pct']:+.1f} % "
            f"({r['paired_overhead_pct']:+.1f} %) | {r['first_loss_ardea']:.6f} / "
            f"{r['first_loss_hand']:.6f} | {r['loss_diff']:.1e} |"
        )
    if not kernels:
        return
    print(f"\nbf16 autocast forward + backward; ardea's rule: eager up to {EAGER_MAX_TOKENS}")
    print("| seq | batch | sdpa s | eager s | eager vs sdpa | faster |")
    print("|---:|---:|---:|---:|---:|---|")
    for r in kernels:
        print(f"| {r['seq']} | {r['batch']} | {r['sdpa_s']:.3f} | {r['eager_s']:.3f} | "
              f"{r['eager_vs_sdpa_pct']:+.1f} % | {r['faster']} |")  # fmt: skip


if __name__ == "__main__":
    main()

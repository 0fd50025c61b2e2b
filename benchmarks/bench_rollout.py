"""Generation throughput: ardea's InProcessEngine against ``transformers`` ``generate()``.

Both run the same model (a 0.8M-parameter Qwen2, fp32, CPU) on the same left-padded prompts
(8-12 tokens). Modes:
- ``sample``: T = 1, no top-k / top-p, exactly ``--new-tokens`` tokens per row (no eos: the
  engine gets no eos ids, ``generate`` gets ``eos_token_id=None``);
- ``greedy``: the same with argmax decoding; both must produce identical tokens;
- ``sample+stop``: T = 1 with four stop tokens, so rows end at varied lengths as real
  completions do; tok/s counts the tokens each side generated (same expectation).
Reported: generated tokens per second from the best of ``--repeats`` runs (after one warm-up),
and the speed ratio engine / generate as the median over adjacent (engine, generate) pairs,
which see similar load from other processes. Threads: torch's default (``--threads`` to set).

    python benchmarks/bench_rollout.py                 # the table in benchmarks/README.md
    python benchmarks/bench_rollout.py --prompts 64 --new-tokens 32 --repeats 2
    python benchmarks/bench_rollout.py --smoke     # seconds: 4 prompts, 8 new tokens, 1 run
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ardea.rollout import InProcessEngine, SamplingParams

PAD = 0


def tiny_qwen2(vocab: int = 110, hidden: int = 128, layers: int = 4) -> Qwen2ForCausalLM:
    """A ~0.8M-parameter Qwen2 causal LM (the size of ardea's default tiny model)."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=4 * hidden // 2 + hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=PAD,
    )
    return Qwen2ForCausalLM(config).float().eval()


def make_prompts(n: int, vocab: int, min_len: int = 8, max_len: int = 12) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    return [torch.randint(1, vocab, (k,), generator=g).tolist() for k in lengths]


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def time_pair(fn_a, fn_b, repeats: int) -> tuple[float, float, float]:
    """Time ``repeats`` adjacent (a, b) pairs after one warm-up each.

    Returns a's best time, b's best time (the closest to an unloaded machine) and the median
    over pairs of time_b / time_a (adjacent runs see similar load from other processes)."""
    fn_a(), fn_b()
    times_a, times_b = [], []
    for _ in range(repeats):
        for fn, times in ((fn_a, times_a), (fn_b, times_b)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    ratios = [b / a for a, b in zip(times_a, times_b, strict=True)]
    return min(times_a), min(times_b), statistics.median(ratios)


STOP_IDS = [1, 2, 3, 4]  # "sample+stop": rows end at varied lengths, as real completions do


def run_case(model, prompts, new_tokens: int, mode: str, repeats: int) -> dict:
    """mode: "sample" (T = 1), "greedy", or "sample+stop" (T = 1 with stop tokens; each side's
    tok/s counts the tokens it generated, whose expected number is the same for both)."""
    stops = STOP_IDS if mode == "sample+stop" else None
    engine = InProcessEngine(model, pad_token_id=PAD, eos_token_ids=stops or [])
    greedy = mode == "greedy"
    params = SamplingParams(temperature=0.0 if greedy else 1.0, max_new_tokens=new_tokens, seed=0)
    ids, mask = left_pad(prompts)
    hf_kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)  # full softmax
    if greedy:
        hf_kwargs = dict(do_sample=False)
    counts = {"engine": [], "hf": []}
    outputs = {}

    def run_engine():
        outputs["engine"] = [c.token_ids for c in engine.generate(prompts, params)]
        counts["engine"].append(sum(len(t) for t in outputs["engine"]))

    def run_hf():
        with torch.inference_mode():
            out = model.generate(
                ids, attention_mask=mask, max_new_tokens=new_tokens, eos_token_id=stops,
                pad_token_id=PAD, **hf_kwargs,
            )  # fmt: skip
        rows = out[:, ids.shape[1] :].tolist()
        outputs["hf"] = [_until_stop(r, stops) for r in rows]
        counts["hf"].append(sum(len(t) for t in outputs["hf"]))

    t_engine, t_hf, ratio = time_pair(run_engine, run_hf, repeats)
    if greedy:
        assert outputs["engine"] == outputs["hf"], "greedy outputs differ"
    if stops is None:
        assert set(counts["engine"]) == set(counts["hf"]) == {len(prompts) * new_tokens}
    tok_engine = statistics.mean(counts["engine"])
    tok_hf = statistics.mean(counts["hf"])
    return {
        "engine_tps": tok_engine / t_engine,
        "hf_tps": tok_hf / t_hf,
        "ratio": ratio * tok_engine / tok_hf,
        "mean_len": tok_engine / len(prompts),
    }


def _until_stop(row: list[int], stops: list[int] | None) -> list[int]:
    for i, tok in enumerate(row if stops else []):
        if tok in stops:
            return row[: i + 1]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--modes", nargs="+", default=["sample", "greedy", "sample+stop"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--smoke", action="store_true", help="4 prompts, 8 tokens, 1 run, 1 thread")
    args = parser.parse_args()
    if args.smoke:
        args.prompts, args.new_tokens, args.repeats = [4], [8], 1
        args.threads = args.threads or 1
    if args.threads:
        torch.set_num_threads(args.threads)

    model = tiny_qwen2()
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"# model: Qwen2 {n_params / 1e6:.2f}M params, fp32, CPU, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}, {platform.processor() or platform.machine()}"
    )
    print("| prompts | new tokens | mode | mean length | engine tok/s | generate() tok/s | ratio |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for n_prompts in args.prompts:
        prompts = make_prompts(n_prompts, model.config.vocab_size)
        for new_tokens in args.new_tokens:
            for mode in args.modes:
                r = run_case(model, prompts, new_tokens, mode, args.repeats)
                print(
                    f"| {n_prompts} | {new_tokens} | {mode} | {r['mean_len']:.1f} | "
                    f"{r['engine_tps']:,.0f} | "
                    f"{r['hf_tps']:,.0f} | {r['ratio']:.2f}x |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

"""Generation throughput: ardea's InProcessEngine against ``transformers`` ``generate()``.

Both run the same model on the same left-padded prompts (8-12 tokens) and lengths, on CPU.
Models (``--sizes``): Qwen2 decoders (``--arch qwen3``: Qwen3, the same sizes with per-head
query/key norms and no q/k/v biases; ``--arch qwen3_moe``: Qwen3-MoE, every MLP 8 experts of
half the intermediate size, 2 per token, top-k weights renormalised, which the compact
step decodes with batched experts, as Mixtral (``--arch mixtral``); the
other families of docs/reference/models.md by name, :data:`FAMILIES`) with tied
embeddings, vocab 110, random init:

- ``0.8M``: hidden 128, intermediate 384, 4 layers, 4 heads, 2 KV heads (ardea's default tiny
  model);
- ``3M``: hidden 256, intermediate 768, 4 layers, 4 heads, 2 KV heads (the GRPO benchmark's);
- ``10M``: hidden 384, intermediate 1152, 6 layers, 6 heads, 2 KV heads.

Modes:
- ``sample``: T = 1, no top-k / top-p, exactly the new tokens per row (no eos: the engine gets
  no eos ids, ``generate`` gets ``eos_token_id=None``);
- ``greedy``: the same with argmax decoding; in fp32 both must produce identical tokens;
- ``sample+stop``: T = 1 with four stop tokens, so rows end at varied lengths as real
  completions do; tok/s counts the tokens each side generated (same expectation).

Precisions, each a like-for-like pair: ``fp32`` (fp32 weights and matmuls on both sides) and
``auto`` (ardea's default compute dtype, ``Precision.resolve("auto", ...)`` at the case's
shapes: bf16 autocast where the probe measured it faster, else fp32; ``generate()`` then
runs under the same autocast, fp32 weights on both sides).

Reported per (size, prompts, new tokens, mode): generated tokens per second of each side in
each precision from the best of ``--repeats`` runs (after one warm-up), and per precision the
speed ratio engine / generate as the median over adjacent (engine, generate) pairs, which see
similar load from other processes. One JSON line per case, then the markdown table.
Threads: torch's default (``--threads`` to set). Target: engine ≥ 1.5× ``generate()``.
``--generic`` also times the engine with its compact decode step off (the Hugging Face
forward at every step, as every family the step does not cover runs): JSON fields
``engine_generic_<precision>_tps`` and ``ratio_fast_over_generic_<precision>`` (the median of
adjacent pairs, as above).

    python benchmarks/bench_rollout.py --threads 1     # the table in benchmarks/README.md
    python benchmarks/bench_rollout.py --sizes 3M --prompts 64 --new-tokens 32 --repeats 2
    python benchmarks/bench_rollout.py --arch qwen3 --sizes 10M --generic --threads 2
    python benchmarks/bench_rollout.py --smoke         # seconds: 4 prompts, 8 new tokens, 1 run
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import platform
import statistics
import time

import torch
import transformers

from ardea.model import Precision
from ardea.model.dtype_probe import ProbeShapes
from ardea.rollout import InProcessEngine, SamplingParams

PAD = 0
VOCAB = 110
# name: (hidden, intermediate, layers, heads, kv heads)
SIZES = {
    "0.8M": (128, 384, 4, 4, 2),
    "3M": (256, 768, 4, 4, 2),
    "10M": (384, 1152, 6, 6, 2),
}
PRECISIONS = ("fp32", "auto")
ARCHS = {"qwen2": "Qwen2", "qwen3": "Qwen3", "qwen3_moe": "Qwen3Moe"}  # transformers' class names


def cycle(pattern: list[str], layers: int) -> list[str]:
    """``pattern`` repeated over ``layers`` layers, the last one full attention."""
    return [pattern[k % len(pattern)] for k in range(layers - 1)] + ["full_attention"]


#: the other families of docs/reference/models.md at these sizes: (config class, model class,
#: their own options given the size's hidden, intermediate, layers and heads); MoE layers get
#: 8 experts of half the intermediate size, 2 per token, sliding windows 32 tokens (they bind
#: from the 32nd position), hybrids one full-attention layer in three
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", lambda h, i, n, a: {}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", lambda h, i, n, a: dict(
        sliding_window=32, layer_types=cycle(["sliding_attention", "sliding_attention", "full_attention"], n))),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", lambda h, i, n, a: dict(
        sliding_window=32, layer_types=cycle(["sliding_attention", "full_attention"], n))),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", lambda h, i, n, a: dict(
        num_local_experts=8, num_experts_per_tok=2, intermediate_size=i // 2)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", lambda h, i, n, a: dict(
        num_local_experts=8, num_experts_per_tok=2, intermediate_size=i // 2, sliding_window=32,
        layer_types=cycle(["sliding_attention", "full_attention"], n))),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", lambda h, i, n, a: dict(
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=i // 2,
        first_k_dense_replace=1, n_group=2, topk_group=1, n_shared_experts=1,
        kv_lora_rank=h // 3, q_lora_rank=None, qk_rope_head_dim=h // a // 2,
        qk_nope_head_dim=h // a // 2, v_head_dim=h // a, head_dim=h // a // 2,
        num_key_value_heads=a)),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", lambda h, i, n, a: dict(
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=i // 2,
        first_k_dense_replace=0, n_group=1, topk_group=1, n_shared_experts=1)),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", lambda h, i, n, a: dict(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=i // 2,
        shared_expert_intermediate_size=i // 2, linear_num_value_heads=a,
        linear_num_key_heads=a // 2, linear_key_head_dim=h // a, linear_value_head_dim=h // a,
        layer_types=cycle(["linear_attention", "linear_attention", "full_attention"], n))),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", lambda h, i, n, a: dict(
        linear_num_value_heads=a, linear_num_key_heads=a // 2, linear_key_head_dim=h // a,
        linear_value_head_dim=h // a,
        layer_types=cycle(["linear_attention", "linear_attention", "full_attention"], n))),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", lambda h, i, n, a: dict(
        layer_types=cycle(["conv", "conv", "full_attention"], n))),
}  # fmt: skip
STOP_IDS = [1, 2, 3, 4]  # "sample+stop": rows end at varied lengths, as real completions do


def decoder(size: str, vocab: int = VOCAB, arch: str = "qwen2") -> torch.nn.Module:
    """The Qwen2 (or ``arch``: Qwen3, Qwen3-MoE; module docstring) causal LM of
    ``SIZES[size]`` (fp32, eval mode, seed 0)."""
    hidden, intermediate, layers, heads, kv_heads = SIZES[size]
    torch.manual_seed(0)
    if arch in FAMILIES:
        return family(arch, hidden, intermediate, layers, heads, kv_heads, vocab)
    config_class = getattr(transformers, ARCHS[arch] + "Config")
    extra = {} if arch == "qwen2" else {"head_dim": hidden // heads}
    if arch == "qwen3_moe":
        extra |= dict(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                      moe_intermediate_size=intermediate // 2)  # fmt: skip
    config = config_class(
        **extra,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=PAD,
    )
    model_class = getattr(transformers, ARCHS[arch] + "ForCausalLM")
    return model_class(config).float().eval()


def family(arch, hidden, intermediate, layers, heads, kv_heads, vocab) -> torch.nn.Module:
    """One of :data:`FAMILIES` at these sizes (fp32, eval mode; the caller seeds)."""
    config_name, model_name, options = FAMILIES[arch]
    kwargs = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                  num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, head_dim=hidden // heads,
                  max_position_embeddings=512, tie_word_embeddings=True, pad_token_id=PAD,
                  bos_token_id=None, eos_token_id=None)  # fmt: skip
    config = getattr(transformers, config_name)(
        **(kwargs | options(hidden, intermediate, layers, heads))
    )
    return getattr(transformers, model_name)(config).float().eval()


def make_prompts(n: int, vocab: int, min_len: int = 8, max_len: int = 12) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    return [torch.randint(1, vocab, (k,), generator=g).tolist() for k in lengths]


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def time_rounds(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Seconds of each of ``fns`` over ``repeats`` rounds (one call each, in order) after one
    warm-up call each; adjacent calls of a round see similar load from other processes."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def auto_precision(model, rows: int, length: int) -> Precision:
    """``compute_dtype=auto`` measured at this model's shapes: ``rows`` sequences decoded
    together, ``rows × length`` tokens in a forward over the whole batch."""
    config = model.config
    shapes = ProbeShapes(config.hidden_size, config.intermediate_size, rows * length, rows)
    return Precision.resolve("auto", torch.device("cpu"), torch.float32, shapes=shapes)


def run_case(
    model, prompts, new_tokens: int, mode: str, repeats: int, generic: bool = False,
    stock=None,
) -> dict:  # fmt: skip
    """Both sides in both precisions on one (prompts, new tokens, mode); mode: "sample"
    (T = 1), "greedy", or "sample+stop" (T = 1 with stop tokens; each side's tok/s counts the
    tokens it generated, whose expected number is the same for both). ``generic``: the
    engine with its compact decode step off too. ``stock``: the model ``generate()`` runs
    (default ``model``): a copy taken before any engine switched its MoE experts to the
    compute dtype, so that side is transformers as shipped."""
    stock = model if stock is None else stock
    stops = STOP_IDS if mode == "sample+stop" else None
    greedy = mode == "greedy"
    params = SamplingParams(temperature=0.0 if greedy else 1.0, max_new_tokens=new_tokens, seed=0)
    ids, mask = left_pad(prompts)
    hf_kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)  # full softmax
    if greedy:
        hf_kwargs = dict(do_sample=False)
    cpu = torch.device("cpu")
    auto = auto_precision(model, len(prompts), len(prompts[0]) + new_tokens)
    counts: dict[str, list[int]] = {}
    outputs: dict[str, list[list[int]]] = {}
    fns = {}

    def record(name: str, rows: list[list[int]]) -> None:
        outputs[name] = rows
        counts.setdefault(name, []).append(sum(len(t) for t in rows))

    for precision in PRECISIONS:
        prec = auto if precision == "auto" else Precision.resolve("float32", cpu, torch.float32)
        engine = InProcessEngine(model, pad_token_id=PAD, eos_token_ids=stops or [], precision=prec)

        def run_engine(engine=engine, name=f"engine_{precision}"):
            record(name, [c.token_ids for c in engine.generate(prompts, params)])

        if generic:
            plain = InProcessEngine(model, pad_token_id=PAD, eos_token_ids=stops or [],
                                    precision=prec)  # fmt: skip
            plain._fast = plain._decoder.fast = None  # the Hugging Face forward at every step
            fns[f"engine_generic_{precision}"] = functools.partial(
                run_engine, plain, f"engine_generic_{precision}"
            )

        def run_hf(prec=prec, name=f"hf_{precision}"):
            with torch.inference_mode(), prec.autocast():
                out = stock.generate(
                    ids, attention_mask=mask, max_new_tokens=new_tokens, eos_token_id=stops,
                    pad_token_id=PAD, **hf_kwargs,
                )  # fmt: skip
            record(name, [_until_stop(r, stops) for r in out[:, ids.shape[1] :].tolist()])

        fns[f"engine_{precision}"], fns[f"hf_{precision}"] = run_engine, run_hf
    times = time_rounds(fns, repeats)
    if greedy:
        assert outputs["engine_fp32"] == outputs["hf_fp32"], "greedy outputs differ in fp32"
    if generic:  # the same seeded rows: the same tokens in fp32
        assert outputs["engine_generic_fp32"] == outputs["engine_fp32"], "fast ≠ generic (fp32)"
    if stops is None:
        assert {c for v in counts.values() for c in v} == {len(prompts) * new_tokens}
    result = {"compute_dtype_auto": str(auto.compute).removeprefix("torch.")}
    for name, t in times.items():
        result[f"{name}_tps"] = statistics.mean(counts[name]) / min(t)
    for precision in PRECISIONS:
        t_engine, t_hf = times[f"engine_{precision}"], times[f"hf_{precision}"]
        tokens = statistics.mean(counts[f"engine_{precision}"]) / statistics.mean(
            counts[f"hf_{precision}"]
        )
        pairs = [h / e for e, h in zip(t_engine, t_hf, strict=True)]
        result[f"ratio_{precision}"] = statistics.median(pairs) * tokens
        if generic:
            t_generic = times[f"engine_generic_{precision}"]
            pairs = [g / e for e, g in zip(t_engine, t_generic, strict=True)]
            result[f"ratio_fast_over_generic_{precision}"] = statistics.median(pairs)
    result["mean_len"] = statistics.mean(counts["engine_fp32"]) / len(prompts)
    return result


def _until_stop(row: list[int], stops: list[int] | None) -> list[int]:
    for i, tok in enumerate(row if stops else []):
        if tok in stops:
            return row[: i + 1]
    return row


HEADER = (
    "| model | params | prompts | new tokens | mode | mean length | engine fp32 tok/s | "
    "generate() fp32 tok/s | ratio fp32 | engine auto tok/s | generate() auto tok/s | "
    "ratio auto |"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--arch", choices=[*ARCHS, *FAMILIES], default="qwen2")
    parser.add_argument(
        "--generic", action="store_true", help="also the engine without its compact step"
    )
    parser.add_argument("--prompts", type=int, nargs="+", default=[64])
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[64])
    parser.add_argument("--modes", nargs="+", default=["sample", "sample+stop"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="0.8M model, 4 prompts, 8 tokens, 1 run, 1 thread"
    )
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.prompts, args.new_tokens, args.repeats = ["0.8M"], [4], [8], 1
        args.modes = ["sample", "greedy", "sample+stop"]
        args.threads = args.threads or 1
    if args.threads:
        torch.set_num_threads(args.threads)

    print(
        f"# {args.arch} models, fp32 weights, CPU, torch {torch.__version__}, threads "
        f"{torch.get_num_threads()}, {platform.processor() or platform.machine()}; "
        "compute dtype auto: measured per case (compute_dtype_auto)"
    )
    rows = []
    for size in args.sizes:
        model = decoder(size, arch=args.arch)
        stock = copy.deepcopy(model)  # generate()'s, never switched (run_case)
        n_params = sum(p.numel() for p in model.parameters())
        for n_prompts in args.prompts:
            prompts = make_prompts(n_prompts, model.config.vocab_size)
            for new_tokens in args.new_tokens:
                for mode in args.modes:
                    r = run_case(
                        model, prompts, new_tokens, mode, args.repeats, args.generic, stock
                    )
                    case = {"model": size, "params": n_params, "prompts": n_prompts,
                            "new_tokens": new_tokens, "mode": mode, **r}  # fmt: skip
                    print(json.dumps(case), flush=True)
                    rows.append(case)
    print(HEADER)
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for c in rows:
        print(
            f"| {c['model']} | {c['params'] / 1e6:.2f}M | {c['prompts']} | {c['new_tokens']} | "
            f"{c['mode']} | {c['mean_len']:.1f} | {c['engine_fp32_tps']:,.0f} | "
            f"{c['hf_fp32_tps']:,.0f} | {c['ratio_fp32']:.2f}x | {c['engine_auto_tps']:,.0f} | "
            f"{c['hf_auto_tps']:,.0f} | {c['ratio_auto']:.2f}x |"
        )


if __name__ == "__main__":
    main()

"""InProcessEngine against independent references: a plain full forward, HF generate()."""

from __future__ import annotations

import pytest
import torch
from rollout_models import EOS, PAD, VOCAB, make_model, sharpen

from ardea.rollout import (
    Completion,
    GenerationEngine,
    InProcessEngine,
    SamplingParams,
)
from ardea.rollout.engines.inprocess import engine as inprocess
from ardea.rollout.engines.inprocess import kv_cache


def engine_for(model, **kwargs) -> InProcessEngine:
    kwargs.setdefault("eos_token_ids", [EOS])
    return InProcessEngine(model, pad_token_id=PAD, **kwargs)


def teacher_forced_logprobs(model, completions: list[Completion], temperature: float):
    """Reference: right-padded full forward of prompt + completion, log_softmax(logits / T)
    gathered at each completion token (T = 1 for greedy)."""
    seqs = [c.prompt_ids + c.token_ids for c in completions]
    width = max(len(s) for s in seqs)
    ids = torch.tensor([s + [PAD] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()  # (N, S, V)
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    out = []
    for i, c in enumerate(completions):
        start = len(c.prompt_ids)
        pos = torch.arange(start - 1, start - 1 + len(c.token_ids))
        out.append(logp[i, pos, torch.tensor(c.token_ids)])
    return out


# (a) behaviour log-probs equal a teacher-forced recomputation ------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprobs_match_teacher_forced_forward(arch, prompts, temperature):
    model = make_model(arch)
    engine = engine_for(model, eos_token_ids=[EOS, 2, 3])
    params = SamplingParams(temperature=temperature, max_new_tokens=20, seed=1, n=3)
    completions = engine.generate(prompts, params)
    assert len(completions) == len(prompts) * 3
    reference = teacher_forced_logprobs(model, completions, temperature)
    worst = 0.0
    for c, ref in zip(completions, reference, strict=True):
        assert len(c.logprobs) == len(c.token_ids) >= 1
        worst = max(worst, (torch.tensor(c.logprobs) - ref).abs().max().item())
    assert worst <= 1e-5
    if temperature > 0:  # the batch really mixes stopped and unfinished rows
        assert {c.finish_reason for c in completions} == {"stop", "length"}


def test_truncated_logprobs_are_renormalised_over_kept_set(prompts):
    model = make_model("qwen2")
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.9, max_new_tokens=8, seed=3)
    completions = engine_for(model, eos_token_ids=[]).generate(prompts, params)
    seqs = [c.prompt_ids + c.token_ids for c in completions]
    for c, seq in zip(completions, seqs, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([seq])).logits[0] / 0.8  # (S, V)
        for k, tok in enumerate(c.token_ids):
            probs = torch.softmax(logits[len(c.prompt_ids) - 1 + k], -1)
            top = torch.sort(probs, descending=True)
            kept = top.values[:5] / top.values[:5].sum()
            n_keep = int((torch.cumsum(kept, 0) - kept < 0.9).sum())
            kept_ids = top.indices[:n_keep].tolist()
            assert tok in kept_ids
            expected = torch.log(kept[kept_ids.index(tok)] / kept[:n_keep].sum())
            assert abs(c.logprobs[k] - expected.item()) <= 1e-5


# (b) greedy equals transformers generate -----------------------------------------------


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_greedy_equals_hf_generate(arch, prompts, attn):
    model = make_model(arch, attn_implementation=attn)
    completions = engine_for(model).generate(
        prompts, SamplingParams(temperature=0, max_new_tokens=12)
    )
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=mask, do_sample=False, max_new_tokens=12,
            eos_token_id=EOS, pad_token_id=PAD,
        )  # fmt: skip
    for c, row in zip(completions, out[:, width:].tolist(), strict=True):
        expected = row[: row.index(EOS) + 1] if EOS in row else row
        assert c.token_ids == expected


# Batch invariance: left padding + position ids make a row independent of its batch --------


def test_batched_equals_alone_greedy(arch, prompts):
    engine = engine_for(make_model(arch))
    params = SamplingParams(temperature=0, max_new_tokens=10)
    batched = engine.generate(prompts, params)
    for prompt, c in zip(prompts, batched, strict=True):
        (alone,) = engine.generate([prompt], params)
        assert alone.token_ids == c.token_ids
        assert max(abs(a - b) for a, b in zip(alone.logprobs, c.logprobs)) <= 1e-5


@pytest.mark.parametrize("max_batch_size", [1, 2])
def test_seeded_batched_equals_small_batches(arch, prompts, max_batch_size):
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=7, n=2)
    model = make_model(arch)
    batched = engine_for(model).generate(prompts, params)
    small = engine_for(model, max_batch_size=max_batch_size).generate(prompts, params)
    for a, b in zip(batched, small, strict=True):
        assert a.prompt_ids == b.prompt_ids and a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-5
    # Row 0 draws the same numbers whatever follows it: the first prompt alone matches.
    (first,) = engine_for(model).generate(prompts[:1], SamplingParams(**{**vars(params), "n": 1}))
    assert first.token_ids == batched[0].token_ids


def test_completions_grouped_by_prompt(prompts):
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=0, n=4)
    completions = engine_for(make_model("qwen2")).generate(prompts, params)
    assert [c.prompt_ids for c in completions] == [p for p in prompts for _ in range(4)]
    group = [tuple(c.token_ids) for c in completions[:4]]
    assert len(set(group)) > 1  # the n samples of a prompt are distinct draws


# (c) stop tokens, eos, max_new_tokens ----------------------------------------------------


def test_stop_token_ends_completion_and_is_included():
    model = make_model("qwen2")
    free = engine_for(model, eos_token_ids=[]).generate(
        [[5, 6, 7]], SamplingParams(temperature=0, max_new_tokens=12)
    )[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    stop = free.token_ids[4]
    k = free.token_ids.index(stop)
    params = SamplingParams(temperature=0, max_new_tokens=12, stop_token_ids=[stop])
    (c,) = engine_for(model, eos_token_ids=[]).generate([[5, 6, 7]], params)
    assert c.finish_reason == "stop"
    assert c.token_ids == free.token_ids[: k + 1] and len(c.logprobs) == k + 1
    # The same token as the model's eos stops too, without listing it in the params.
    (e,) = engine_for(model, eos_token_ids=[stop]).generate([[5, 6, 7]], params)
    assert e.token_ids == c.token_ids and e.finish_reason == "stop"


def test_min_new_tokens_masks_stop_tokens_and_reports_the_masked_logprobs(prompts):
    """Half the vocabulary stops a row; with min_new_tokens = 5 none of it is sampled in the
    first 5 tokens and their log-probs are a teacher-forced log_softmax with those columns
    at −inf (the distribution sampled from); later tokens are unmasked and stops work."""
    model, stops = make_model("qwen2"), list(range(1, VOCAB // 2))
    kwargs = dict(temperature=1.0, max_new_tokens=12, stop_token_ids=stops, seed=4, n=4)
    free = engine_for(model).generate(prompts, SamplingParams(**kwargs))
    assert min(len(c.token_ids) for c in free) < 5  # without the mask rows stop early
    forced = engine_for(model).generate(prompts, SamplingParams(min_new_tokens=5, **kwargs))
    assert min(len(c.token_ids) for c in forced) >= 5
    assert not any(t in stops for c in forced for t in c.token_ids[:5])
    assert any(c.finish_reason == "stop" and len(c.token_ids) < 12 for c in forced)
    worst = 0.0
    for c in forced:
        with torch.no_grad():
            logits = model(torch.tensor([c.prompt_ids + c.token_ids])).logits[0].float()
        logits = logits[len(c.prompt_ids) - 1 : -1]  # (R, V): the logits of each token
        logits[:5, stops] = float("-inf")
        reference = torch.log_softmax(logits, -1)[torch.arange(len(c.token_ids)), c.token_ids]
        worst = max(worst, (torch.tensor(c.logprobs) - reference).abs().max().item())
    assert worst <= 1e-5


def test_rows_stop_independently(prompts):
    model = make_model("llama")
    params = SamplingParams(temperature=0, max_new_tokens=9)
    free = engine_for(model, eos_token_ids=[]).generate(prompts, params)
    stop = free[0].token_ids[0]  # row 0 stops at its first token
    params = SamplingParams(temperature=0, max_new_tokens=9, stop_token_ids=[stop])
    out = engine_for(model, eos_token_ids=[]).generate(prompts, params)
    assert out[0].token_ids == [stop] and out[0].finish_reason == "stop"
    for f, c in zip(free, out, strict=True):
        k = f.token_ids.index(stop) + 1 if stop in f.token_ids else len(f.token_ids)
        assert c.token_ids == f.token_ids[:k]
        assert c.finish_reason == ("stop" if stop in f.token_ids else "length")
        assert len(c.token_ids) <= 9 and len(c.logprobs) == len(c.token_ids)


def test_many_rows_with_early_stops_match_alone():
    """Enough rows that finished ones are dropped from the batch mid-generation."""
    model = make_model("qwen2")
    prompts = [[i % 50 + 3, (7 * i) % 50 + 3] for i in range(12)]
    params = SamplingParams(temperature=0.9, max_new_tokens=16, seed=5)
    engine = engine_for(model, eos_token_ids=[EOS, 2, 3, 4, 5, 6, 7])
    batched = engine.generate(prompts, params)
    alone = engine_for(model, eos_token_ids=[EOS, 2, 3, 4, 5, 6, 7], max_batch_size=1)
    for a, b in zip(batched, alone.generate(prompts, params), strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-5
    lengths = {len(c.token_ids) for c in batched}
    assert len(lengths) >= 3 and 16 in lengths


# (d) seeds ------------------------------------------------------------------------------


def test_seed_reproducible_regardless_of_global_rng(prompts):
    engine = engine_for(make_model("qwen2"))
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=123)
    torch.manual_seed(0)
    first = engine.generate(prompts, params)
    torch.manual_seed(999)
    torch.rand(17)
    again = engine.generate(prompts, params)
    other = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=10, seed=124))
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert [c.logprobs for c in first] == [c.logprobs for c in again]
    assert [c.token_ids for c in first] != [c.token_ids for c in other]


def test_unseeded_follows_global_rng(prompts):
    engine = engine_for(make_model("qwen2"))
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    torch.manual_seed(3)
    a = engine.generate(prompts, params)
    b = engine.generate(prompts, params)
    torch.manual_seed(3)
    c = engine.generate(prompts, params)
    assert [x.token_ids for x in a] == [x.token_ids for x in c]
    assert [x.token_ids for x in a] != [x.token_ids for x in b]


# (e) truncation limits and the sampled distribution ----------------------------------------


@pytest.mark.parametrize("truncation", [{"top_k": 1}, {"top_p": 1e-6}])
def test_extreme_truncation_equals_greedy(arch, prompts, truncation):
    engine = engine_for(make_model(arch))
    greedy = engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=10))
    params = SamplingParams(temperature=0.7, max_new_tokens=10, seed=0, **truncation)
    for g, c in zip(greedy, engine.generate(prompts, params), strict=True):
        assert c.token_ids == g.token_ids
        assert c.logprobs == [0.0] * len(c.token_ids)  # one kept token: log 1


def assert_matches_distribution(tokens: list[int], probs: torch.Tensor, sigmas: float = 5.0):
    """Every token's frequency within ``sigmas`` binomial standard deviations of its prob."""
    n = len(tokens)
    freq = torch.bincount(torch.tensor(tokens), minlength=probs.numel()).double() / n
    p = probs.double()
    bound = sigmas * torch.sqrt(p * (1 - p) / n) + 1.0 / n
    assert ((freq - p).abs() <= bound).all(), (freq - p).abs().max().item()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (0.7, 6, 0.8)])
def test_empirical_distribution_matches(temperature, top_k, top_p):
    model = sharpen(make_model("qwen2"))
    prompt = [5, 6, 7]
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1] / temperature  # (V,)
    probs = torch.softmax(logits, -1)
    if top_k or top_p < 1:  # independent reference: sort, cut, renormalise
        order = torch.argsort(probs, descending=True)
        kept = probs[order][: top_k or VOCAB]
        kept = kept / kept.sum()
        n_keep = int((torch.cumsum(kept, 0) - kept < top_p).sum())
        probs = torch.zeros_like(probs)
        probs[order[:n_keep]] = kept[:n_keep] / kept[:n_keep].sum()
    assert probs.max() > 0.15  # a peaked distribution: a wrong temperature would show
    n = 20_000
    params = SamplingParams(
        temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=1, seed=11, n=n
    )
    completions = engine_for(model, eos_token_ids=[]).generate([prompt], params)
    assert_matches_distribution([c.token_ids[0] for c in completions], probs)
    if temperature != 1.0:  # and the test can tell temperatures apart
        with pytest.raises(AssertionError):
            tokens = [c.token_ids[0] for c in completions]
            assert_matches_distribution(tokens, torch.softmax(logits * temperature, -1))


# Fast paths (preallocated KV buffers, prepared 4D masks) against the stock ones ------------


def test_fast_paths_equal_stock_cache_and_2d_masks(arch, prompts, monkeypatch):
    model = make_model(arch)
    assert inprocess.additive_mask_dtype(model) == torch.float32
    cache = kv_cache.new_cache(model, capacity=8)
    assert all(type(layer) is kv_cache.PreallocatedLayer for layer in cache.layers)
    params = SamplingParams(temperature=0.8, max_new_tokens=12, seed=2, n=2)
    stops = [EOS, 2, 3, 4]
    fast = engine_for(model, eos_token_ids=stops).generate(prompts, params)
    monkeypatch.setattr(kv_cache, "DynamicLayer", None)
    monkeypatch.setattr(inprocess, "additive_mask_dtype", lambda model: None)
    stock = engine_for(model, eos_token_ids=stops).generate(prompts, params)
    assert type(kv_cache.new_cache(model, capacity=8).layers[0]) is not kv_cache.PreallocatedLayer
    for a, b in zip(fast, stock, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-5


# Model mode ---------------------------------------------------------------------------------


def test_eval_mode_during_generation_and_mode_restored(prompts):
    model = make_model("qwen2", attention_dropout=0.5)
    model.train()
    model.model.layers[0].eval()  # a mixed state must come back exactly
    engine = engine_for(model)
    params = SamplingParams(temperature=0, max_new_tokens=8)
    out = engine.generate(prompts, params)
    assert model.training and not model.model.layers[0].training
    assert model.model.layers[1].training
    reference = make_model("qwen2", attention_dropout=0.5).eval()
    expected = engine_for(reference).generate(prompts, params)
    assert [c.token_ids for c in out] == [c.token_ids for c in expected]


def test_is_a_generation_engine():
    assert isinstance(engine_for(make_model("qwen2")), GenerationEngine)

"""Weight updates and policy versions: atomic, validated, visible in every completion."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
from rollout_models import EOS, PAD, make_model

from ardea.rollout import EngineSpec, InProcessEngine, SamplingParams, make_engine, own_copy

GREEDY = SamplingParams(temperature=0, max_new_tokens=12)
PROMPTS = [[5, 6, 7], [8, 9], [20, 21, 22, 23]]


def engine_for(model, **kwargs) -> InProcessEngine:
    return InProcessEngine(model, pad_token_id=PAD, eos_token_ids=[EOS], **kwargs)


def tokens(completions) -> list[list[int]]:
    return [c.token_ids for c in completions]


def test_update_weights_changes_outputs_and_version():
    engine = engine_for(make_model("qwen2", seed=0))
    before = engine.generate(PROMPTS, GREEDY)
    assert engine.version == 0 and {c.version for c in before} == {0}
    other = make_model("qwen2", seed=1)
    engine.update_weights(other.state_dict(), version=1)
    after = engine.generate(PROMPTS, GREEDY)
    assert engine.version == 1 and {c.version for c in after} == {1}
    assert tokens(after) == tokens(engine_for(other).generate(PROMPTS, GREEDY))
    assert tokens(after) != tokens(before)


def test_shared_weights_fast_path_copies_nothing(monkeypatch):
    """An engine on the trainer's own module: the trainer changes the weights in place and
    publishes them with update_weights(state_dict, version); nothing is copied."""
    model = make_model("llama")
    engine = engine_for(model, version=4)
    with torch.no_grad():
        model.lm_head.weight.copy_(make_model("llama", seed=2).lm_head.weight)
    copies = []
    copy_ = torch.Tensor.copy_
    monkeypatch.setattr(
        torch.Tensor, "copy_", lambda t, *a, **k: copies.append(1) or copy_(t, *a, **k)
    )
    engine.update_weights(model.state_dict(), version=5)
    monkeypatch.undo()
    assert not copies
    out = engine.generate(PROMPTS, GREEDY)
    assert {c.version for c in out} == {5}
    changed = make_model("llama")
    changed.lm_head.weight.data.copy_(make_model("llama", seed=2).lm_head.weight)
    assert tokens(out) == tokens(engine_for(changed).generate(PROMPTS, GREEDY))


def test_an_engine_that_owns_its_weights_changes_only_through_update_weights():
    model = make_model("qwen2", seed=0)
    tokenizer = SimpleNamespace(pad_token_id=PAD, eos_token_id=EOS)
    engine = make_engine("in_process", EngineSpec.of(model, tokenizer), module=own_copy(model))
    before = tokens(engine.generate(PROMPTS, GREEDY))
    other = make_model("qwen2", seed=1)
    model.load_state_dict(other.state_dict())  # the trainer's weights move ...
    assert tokens(engine.generate(PROMPTS, GREEDY)) == before  # ... the engine's do not
    engine.update_weights(model.state_dict(), version=1)
    assert tokens(engine.generate(PROMPTS, GREEDY)) == tokens(
        engine_for(other).generate(PROMPTS, GREEDY)
    )


def test_version_must_increase_and_bad_state_dict_changes_nothing():
    model = make_model("qwen2")
    engine = engine_for(model, version=3)
    reference = tokens(engine.generate(PROMPTS, GREEDY))
    good = make_model("qwen2", seed=1).state_dict()
    with pytest.raises(ValueError, match="version must increase: got 3, current version is 3"):
        engine.update_weights(good, version=3)
    missing = {k: v for k, v in good.items() if k != "lm_head.weight"}
    with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\]"):
        engine.update_weights(missing, version=4)
    shaped = {**good, "lm_head.weight": torch.zeros(3, 3)}
    with pytest.raises(ValueError, match="shape mismatches"):
        engine.update_weights(shaped, version=4)
    extra = {**good, "bogus": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"unexpected \['bogus'\]"):
        engine.update_weights(extra, version=4)
    assert engine.version == 3
    assert tokens(engine.generate(PROMPTS, GREEDY)) == reference


def test_tied_alias_may_be_omitted():
    model = make_model("qwen2", tie_word_embeddings=True)
    source = make_model("qwen2", seed=3, tie_word_embeddings=True)
    state = {k: v for k, v in source.state_dict().items() if k != "lm_head.weight"}
    engine = engine_for(model)
    engine.update_weights(state, version=1)
    assert tokens(engine.generate(PROMPTS, GREEDY)) == tokens(
        engine_for(source).generate(PROMPTS, GREEDY)
    )


def greedy_tokens_of(model, completion) -> list[int]:
    """Reference: the argmax of ``model`` (a full forward) before each completion token."""
    ids = torch.tensor([completion.prompt_ids + completion.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    start = len(completion.prompt_ids) - 1
    return logits[start : start + len(completion.token_ids)].argmax(-1).tolist()


def test_concurrent_generate_and_update_label_every_token_with_its_weights():
    """One thread generates while another flips the weights between A (even versions) and B
    (odd versions) without waiting for it: every token must be the greedy token of the
    weights its span names, given the tokens before it."""
    model_a, model_b = make_model("qwen2", seed=0), make_model("qwen2", seed=1)
    params = SamplingParams(temperature=0, max_new_tokens=24)
    states = {0: model_a.state_dict(), 1: model_b.state_dict()}
    states = {k: {n: t.clone() for n, t in s.items()} for k, s in states.items()}
    engine = engine_for(make_model("qwen2", seed=0))
    seen, errors = [], []
    start = threading.Barrier(2)

    def generate_loop():
        start.wait()
        for _ in range(8):
            seen.extend(engine.generate(PROMPTS, params))

    def update_loop():
        start.wait()
        for version in range(1, 25):
            engine.update_weights(states[version % 2], version)

    def guarded(fn):
        def run():
            try:
                fn()
            except Exception as exc:  # surfaced by the assertion below
                errors.append(exc)

        return run

    threads = [threading.Thread(target=guarded(f)) for f in (generate_loop, update_loop)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert engine.version == 24 and len(seen) == 8 * len(PROMPTS)
    models = {0: model_a.eval(), 1: model_b.eval()}
    for c in seen:
        references = {v % 2: greedy_tokens_of(models[v % 2], c) for _, v in c.spans}
        expected = [references[v % 2][i] for i, v in enumerate(c.token_versions)]
        assert c.token_ids == expected, c.spans

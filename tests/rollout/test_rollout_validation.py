"""Bad input fails early with errors that name the field, the index and the limits."""

from __future__ import annotations

import pytest
from rollout_models import EOS, PAD, VOCAB, make_model

from ardea.rollout import InProcessEngine, SamplingParams

SHORT = SamplingParams(max_new_tokens=8)


@pytest.fixture(scope="module")
def engine() -> InProcessEngine:
    return InProcessEngine(make_model("qwen2"), pad_token_id=PAD, eos_token_ids=EOS)


def test_empty_prompt_list_returns_empty(engine):
    assert engine.generate([], SHORT) == []


def test_empty_prompt_names_its_index(engine):
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        engine.generate([[3, 4], []], SHORT)


@pytest.mark.parametrize("bad", [VOCAB, -1, 10**9])
def test_token_out_of_vocab(engine, bad):
    with pytest.raises(ValueError, match=rf"prompts\[2\] contains token id {bad}.*\[0, {VOCAB}\)"):
        engine.generate([[3], [4], [5, bad]], SHORT)


@pytest.mark.parametrize("bad", [[1.5], ["a"], "abc", [[1]]])
def test_prompt_must_be_token_ids(engine, bad):
    with pytest.raises(ValueError, match=r"prompts\[0\]"):
        engine.generate([bad], SHORT)


def test_prompt_too_long_names_the_numbers(engine):
    prompt = list(range(2, 52))  # 50 tokens; the model has 64 positions
    engine.generate([prompt], SamplingParams(max_new_tokens=14, temperature=0))  # exactly fits
    with pytest.raises(ValueError, match=r"prompts\[0\] has 50 tokens.*max_new_tokens=15.*65.*64"):
        engine.generate([prompt], SamplingParams(max_new_tokens=15))


def test_params_must_be_sampling_params(engine):
    with pytest.raises(ValueError, match="SamplingParams"):
        engine.generate([[3]], {"temperature": 0})


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -0.1),
        ("temperature", 1e-6),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("top_k", 2.5),
        ("max_new_tokens", 0),
        ("min_new_tokens", -1),
        ("min_new_tokens", 65),  # above max_new_tokens=64
        ("n", 0),
        ("seed", -1),
        ("seed", 2**64),
        ("stop_token_ids", 5),
        ("stop_token_ids", [3, -2]),
        ("row_ids", 3),
        ("row_ids", [0, -1]),
    ],
)
def test_sampling_params_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_sampling_params_defaults_are_valid():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.n, p.seed, p.stop_token_ids) == (
        1.0, 1.0, 0, 1, None, []
    )  # fmt: skip
    assert SamplingParams(stop_token_ids=(4, 5)).stop_token_ids == [4, 5]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"pad_token_id": VOCAB, "eos_token_ids": EOS}, "pad_token_id"),
        ({"pad_token_id": PAD, "eos_token_ids": [EOS, -3]}, r"eos_token_ids\[1\]"),
        ({"pad_token_id": PAD, "eos_token_ids": EOS, "max_batch_size": 0}, "max_batch_size"),
        ({"pad_token_id": PAD, "eos_token_ids": EOS, "version": -1}, "version"),
    ],
)
def test_engine_constructor_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        InProcessEngine(make_model("qwen2"), **kwargs)

"""Pure sampling helpers against hand-computed distributions."""

from __future__ import annotations

import math

import pytest
import torch

from ardea.model.truncation import top_k_filter, top_p_filter
from ardea.rollout.engines.inprocess.sampling import (
    next_tokens,
    sample_inverse_cdf,
    sampling_logits,
    suppress_tokens,
)

NEG = float("-inf")


def test_top_k_keeps_k_largest_and_ties():
    z = torch.tensor([[1.0, 3.0, 2.0, 0.0], [5.0, 5.0, 1.0, 5.0]])
    out = top_k_filter(z, 2)
    assert out.shape == (2, 4)
    assert torch.equal(out[0], torch.tensor([NEG, 3.0, 2.0, NEG]))
    assert torch.equal(out[1], torch.tensor([5.0, 5.0, NEG, 5.0]))  # ties with the 2nd kept
    assert torch.equal(top_k_filter(z, 0), z) and torch.equal(top_k_filter(z, 4), z)


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    z = probs.log()
    kept = lambda p: torch.isfinite(top_p_filter(z, p))[0].tolist()  # noqa: E731
    assert kept(0.5) == [True, False, False, False]  # 0.5 alone reaches 0.5
    assert kept(0.51) == [True, True, False, False]
    assert kept(0.8) == [True, True, False, False]  # 0.5 + 0.3 reaches 0.8
    assert kept(0.81) == [True, True, True, False]
    assert kept(1e-9) == [True, False, False, False]  # the top token is always kept
    assert kept(1.0) == [True, True, True, True]
    # Unsorted input: the kept set is found by probability, not by position.
    perm = torch.tensor([2, 0, 3, 1])
    assert torch.isfinite(top_p_filter(z[:, perm], 0.8))[0].tolist() == [False, True, False, True]


def test_sampling_logits_renormalises_over_kept_set():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0]])
    t = 0.7
    z = sampling_logits(logits, temperature=t, top_k=3, top_p=0.9)
    p = torch.softmax(logits / t, -1)[0, :3]
    p = p / p.sum()  # top-3 renormalised ≈ [0.771, 0.185, 0.044]: top-p 0.9 keeps two
    assert (p[0] < 0.9) and (p[0] + p[1] >= 0.9)
    expected = torch.tensor([math.log(p[0] / (p[0] + p[1])), math.log(p[1] / (p[0] + p[1]))])
    logp = torch.log_softmax(z, -1)[0]
    assert torch.allclose(logp[:2], expected, atol=1e-6)
    assert torch.isinf(logp[2:]).all()


def test_inverse_cdf_picks_the_bucket_of_each_uniform():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    z = probs.log().expand(6, 4)
    u = torch.tensor([0.0, 0.0999, 0.1001, 0.6999, 0.7001, 1.0 - 1e-16])
    tokens = sample_inverse_cdf(z, u)
    assert tokens.tolist() == [0, 0, 2, 2, 3, 3]


def test_inverse_cdf_never_returns_a_masked_token():
    z = torch.tensor([[0.0, NEG, 1.0, NEG, NEG]]).expand(4, 5)
    u = torch.tensor([0.0, 0.5, 1.0 - 2**-53, 0.9999999])
    tokens = sample_inverse_cdf(z, u)
    assert set(tokens.tolist()) <= {0, 2}
    assert tokens[-2].item() == 2


def test_next_tokens_greedy_reports_t1_logprob():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    tokens, logprobs = next_tokens(logits, temperature=0.0)
    assert tokens.tolist() == [1, 0]
    expected = torch.log_softmax(logits, -1)[[0, 1], [1, 0]]
    assert torch.allclose(logprobs, expected)


def test_next_tokens_sampled_logprob_is_log_softmax_over_t():
    torch.manual_seed(0)
    logits = torch.randn(5, 11)
    u = torch.rand(5, dtype=torch.float64)
    tokens, logprobs = next_tokens(logits, temperature=0.6, uniforms=u)
    assert tokens.shape == (5,) and logprobs.shape == (5,)
    expected = torch.log_softmax(logits / 0.6, -1).gather(-1, tokens[:, None])[:, 0]
    assert torch.allclose(logprobs, expected, atol=1e-6)


def test_next_tokens_needs_uniforms_when_sampling():
    with pytest.raises(ValueError, match="uniforms"):
        next_tokens(torch.zeros(1, 3), temperature=1.0)


def test_suppressed_stop_token_renormalises_the_sampled_distribution():
    """Vocabulary of 3 with p = (1/2, 1/4, 1/4) and token 0 a stop token: masked, the
    sampled distribution is π = (0, 1/2, 1/2), and an unmasked recomputation of the same
    token is lower by −log(1 − p_stop) = log 2."""
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]] * 2))
    masked = suppress_tokens(logits, torch.tensor([0]))
    assert masked[:, 0].tolist() == [NEG, NEG] and torch.equal(masked[:, 1:], logits[:, 1:])
    tokens, logprobs = next_tokens(masked, temperature=1.0, uniforms=torch.tensor([0.3, 0.7]))
    assert tokens.tolist() == [1, 2]  # the CDF of π is (0, 1/2, 1)
    assert logprobs.tolist() == pytest.approx([math.log(0.5)] * 2, abs=1e-6)
    unmasked = torch.log_softmax(logits, -1)[[0, 1], tokens]  # log(1/4)
    assert (logprobs - unmasked).tolist() == pytest.approx([math.log(2)] * 2, abs=1e-6)
    # T = 2: softmax(log p / 2) ∝ sqrt(p) = (√½, ½, ½), so p_stop = √½ / (√½ + 1) and the
    # masked π is (0, 1/2, 1/2) again
    tokens, logprobs = next_tokens(masked, temperature=2.0, uniforms=torch.tensor([0.3, 0.7]))
    assert tokens.tolist() == [1, 2]
    assert logprobs.tolist() == pytest.approx([math.log(0.5)] * 2, abs=1e-6)
    p_stop = math.sqrt(0.5) / (math.sqrt(0.5) + 1)
    unmasked = torch.log_softmax(logits / 2, -1)[[0, 1], tokens]
    assert (logprobs - unmasked).tolist() == pytest.approx([-math.log(1 - p_stop)] * 2, abs=1e-6)
    # greedy: logits (3, 1, 2) with token 0 masked pick token 2, log-prob 2 − log(e + e²)
    tokens, logprobs = next_tokens(
        suppress_tokens(torch.tensor([[3.0, 1.0, 2.0]]), torch.tensor([0])), temperature=0.0
    )
    assert tokens.tolist() == [2]
    assert logprobs.item() == pytest.approx(2 - math.log(math.e + math.e**2), abs=1e-6)

"""Chunked next-token log-probs and entropies against a naive full log-softmax."""

import math

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM

from ardea.model import (
    build_tiny_model,
    entropy_from_logits,
    logprobs_from_logits,
    position_ids_from_mask,
    sequence_logprobs,
)

from .conftest import random_ids

ATOL = 1e-6
# Tolerance per model dtype. A float64 model isolates the algorithm (only the final cast
# to float32 rounds); a float32 model adds ~1 ulp of float32 per step, ~3e-7 relative.
TOLERANCE = {torch.float64: dict(atol=1e-6, rtol=0.0), torch.float32: dict(atol=1e-6, rtol=1e-6)}


def naive(model, input_ids, attention_mask=None, temperature=1.0):
    """Reference: the model's full forward, a full float32 (float64 for a float64 model)
    log-softmax, then gather. Entries not scored (last column; padding when a mask is
    given) are zero."""
    positions = None if attention_mask is None else position_ids_from_mask(attention_mask)
    logits = model(input_ids, attention_mask=attention_mask, position_ids=positions).logits
    logits = logits if logits.dtype == torch.float64 else logits.float()
    log_probs = torch.log_softmax(logits / temperature, dim=-1)  # (N, S, V)
    picked = log_probs[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)[:, :-1]
    scored = torch.ones_like(picked, dtype=torch.bool)
    if attention_mask is not None:
        scored = attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()
    zero_col = picked.new_zeros(picked.shape[0], 1)
    return (
        torch.cat([torch.where(scored, picked, 0.0), zero_col], dim=1),
        torch.cat([torch.where(scored, entropy, 0.0), zero_col], dim=1),
    )


def right_padded_batch():
    input_ids = random_ids(4, 11, seed=3)
    mask = torch.ones_like(input_ids)
    mask[1, 7:] = 0
    mask[2, 2:] = 0
    input_ids = input_ids * mask  # pad id 0 after the end
    return input_ids, mask


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("chunk_size", [1, 7, 10_000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_entropy_match_naive(policy, chunk_size, temperature, dtype):
    policy.to(dtype)
    input_ids = random_ids(3, 9, seed=1)
    with torch.no_grad():
        out = sequence_logprobs(
            policy, input_ids, temperature=temperature, chunk_size=chunk_size, with_entropy=True
        )
        ref_lp, ref_ent = naive(policy, input_ids, temperature=temperature)
    assert out.logprobs.shape == out.entropy.shape == (3, 9)
    assert out.logprobs.dtype == out.entropy.dtype == torch.float32
    torch.testing.assert_close(out.logprobs.to(dtype), ref_lp, **TOLERANCE[dtype])
    torch.testing.assert_close(out.entropy.to(dtype), ref_ent, **TOLERANCE[dtype])
    assert torch.count_nonzero(out.logprobs[:, -1]) == 0
    assert out.aux_loss is None


def test_chunk_sizes_agree(policy):
    input_ids, mask = right_padded_batch()
    with torch.no_grad():
        results = [
            sequence_logprobs(policy, input_ids, mask, chunk_size=c, with_entropy=True)
            for c in (1, 7, 10_000)
        ]
    for other in results[1:]:
        torch.testing.assert_close(other.logprobs, results[0].logprobs, atol=ATOL, rtol=0)
        torch.testing.assert_close(other.entropy, results[0].entropy, atol=ATOL, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_right_padding(policy, dtype):
    policy.to(dtype)
    input_ids, mask = right_padded_batch()
    with torch.no_grad():
        out = sequence_logprobs(policy, input_ids, mask, chunk_size=5, with_entropy=True)
        ref_lp, ref_ent = naive(policy, input_ids, mask)
    torch.testing.assert_close(out.logprobs.to(dtype), ref_lp, **TOLERANCE[dtype])
    torch.testing.assert_close(out.entropy.to(dtype), ref_ent, **TOLERANCE[dtype])
    assert torch.count_nonzero(out.logprobs[1, 6:]) == 0  # t=6 would score padding
    assert torch.count_nonzero(out.logprobs[2, 1:]) == 0
    # Each row alone, unpadded, gives the same numbers: padding does not leak in.
    for row, length in [(1, 7), (2, 2)]:
        with torch.no_grad():
            alone = sequence_logprobs(policy, input_ids[row : row + 1, :length]).logprobs
        torch.testing.assert_close(
            out.logprobs[row, : length - 1], alone[0, :-1], atol=ATOL, rtol=0
        )


def test_left_padding_matches_unpadded_row(policy):
    row = random_ids(1, 6, seed=8)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), row], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        out = sequence_logprobs(policy, padded, mask).logprobs
        alone = sequence_logprobs(policy, row).logprobs
    assert torch.count_nonzero(out[:, :3]) == 0  # the first real token has no context
    torch.testing.assert_close(out[:, 3:], alone, atol=1e-5, rtol=0)


def test_packed_documents_score_as_if_alone(policy):
    first, second = random_ids(1, 5, seed=15), random_ids(1, 4, seed=16)
    packed = torch.cat([first, second], dim=1)
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3]])
    with torch.no_grad():
        out = sequence_logprobs(policy, packed, position_ids=positions).logprobs
        alone = [sequence_logprobs(policy, doc).logprobs for doc in (first, second)]
    torch.testing.assert_close(out[:, :4], alone[0][:, :4], atol=ATOL, rtol=1e-6)
    torch.testing.assert_close(out[:, 5:8], alone[1][:, :3], atol=ATOL, rtol=1e-6)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-6), (torch.float32, 5e-6)])
def test_gradients_match_naive(policy, dtype, tolerance):
    """Every parameter's gradient equals the unchunked computation's, to ``tolerance``
    relative to that gradient's largest entry."""
    policy.to(dtype).train()
    input_ids, mask = right_padded_batch()
    weights = torch.randn(input_ids.shape, generator=torch.Generator().manual_seed(9))

    def grads(compute):
        policy.zero_grad()
        logprobs, entropy = compute()
        ((logprobs * weights).sum() + 0.3 * (entropy * weights).sum()).backward()
        return {name: p.grad.clone() for name, p in policy.named_parameters()}

    def chunked():
        out = sequence_logprobs(policy, input_ids, mask, chunk_size=6, with_entropy=True)
        assert out.logprobs.requires_grad
        return out.logprobs, out.entropy

    expected = grads(lambda: naive(policy, input_ids, mask))
    got = grads(chunked)
    for name, grad in expected.items():
        scale = grad.abs().max()
        assert scale > 0, name
        assert (got[name] - grad).abs().max() <= tolerance * scale, name


def largest_saved_vocab_tensor(compute, vocab: int) -> int:
    """numel of the largest tensor autograd keeps for backward whose last dim is V."""
    sizes = [0]

    def pack(tensor):
        if tensor.dim() > 0 and tensor.shape[-1] == vocab:
            sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        compute()
    return max(sizes)


def test_backward_keeps_no_full_vocab_logits(policy):
    policy.train()
    input_ids = random_ids(8, 16, seed=10)
    vocab = policy.config.vocab_size
    chunk = 16
    naive_size = largest_saved_vocab_tensor(lambda: naive(policy, input_ids), vocab)
    assert naive_size >= 8 * 15 * vocab  # the detector sees the full (N, S, V) logits
    chunked_size = largest_saved_vocab_tensor(
        lambda: sequence_logprobs(policy, input_ids, chunk_size=chunk, with_entropy=True), vocab
    )
    assert chunked_size <= chunk * vocab


def test_soft_capped_model_uses_full_forward():
    config = Gemma2Config(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        final_logit_softcapping=2.0, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(config).eval()
    input_ids = random_ids(2, 7, vocab=40, seed=11)
    with torch.no_grad():
        head_only = model.lm_head(model.model(input_ids).last_hidden_state)
        assert not torch.allclose(head_only, model(input_ids).logits, atol=1e-3)
        out = sequence_logprobs(model, input_ids, chunk_size=3, with_entropy=True)
        ref_lp, ref_ent = naive(model, input_ids)
    torch.testing.assert_close(out.logprobs, ref_lp, atol=ATOL, rtol=0)
    torch.testing.assert_close(out.entropy, ref_ent, atol=ATOL, rtol=0)


def test_llama_and_bfloat16(tokenizer):
    llama = build_tiny_model(tokenizer, arch="llama", hidden_size=32, intermediate_size=64)
    input_ids = random_ids(2, 6, seed=12)
    with torch.no_grad():
        torch.testing.assert_close(
            sequence_logprobs(llama, input_ids).logprobs,
            naive(llama, input_ids)[0],
            atol=ATOL,
            rtol=0,
        )
        out = sequence_logprobs(llama.to(torch.bfloat16), input_ids, with_entropy=True)
    assert out.logprobs.dtype == out.entropy.dtype == torch.float32
    assert torch.isfinite(out.logprobs).all()


def test_edge_shapes_and_validation(small_policy):
    with torch.no_grad():
        single = sequence_logprobs(small_policy, random_ids(3, 1), with_entropy=True)
        assert single.logprobs.shape == (3, 1) and torch.count_nonzero(single.logprobs) == 0
        empty_row = sequence_logprobs(
            small_policy, random_ids(2, 4), torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]])
        )
        assert torch.count_nonzero(empty_row.logprobs[0]) == 0
        assert torch.count_nonzero(empty_row.logprobs[1, :3]) == 3
        assert sequence_logprobs(small_policy, random_ids(2, 4)).entropy is None
        assert not sequence_logprobs(small_policy, random_ids(2, 4)).logprobs.requires_grad
    with pytest.raises(ValueError, match="log-prob input_ids must be 2-D"):
        sequence_logprobs(small_policy, random_ids(1, 4)[0])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sequence_logprobs(small_policy, random_ids(1, 4), temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        sequence_logprobs(small_policy, random_ids(1, 4), chunk_size=0)


def test_logprobs_from_logits_is_exact_and_stable():
    generator = torch.Generator().manual_seed(13)
    logits = torch.randn(4, 5, 50, generator=generator) * 5
    labels = torch.randint(0, 50, (4, 5), generator=generator)
    reference = torch.log_softmax(logits.double(), -1).gather(-1, labels[..., None]).squeeze(-1)
    got = logprobs_from_logits(logits, labels)
    assert got.shape == (4, 5) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference, atol=1e-6, rtol=1e-6)
    exact = logprobs_from_logits(logits.double(), labels)
    assert exact.dtype == torch.float64
    torch.testing.assert_close(exact, reference, atol=1e-12, rtol=0)
    shifted = logprobs_from_logits(logits + 1e4, labels)  # exp(1e4) overflows if unstable
    assert torch.isfinite(shifted).all()
    torch.testing.assert_close(shifted, got, atol=5e-3, rtol=0)
    bf16 = logprobs_from_logits(logits.bfloat16(), labels)
    assert bf16.dtype == torch.float32


def test_entropy_from_logits():
    generator = torch.Generator().manual_seed(14)
    logits = torch.randn(6, 30, generator=generator) * 3
    p = torch.softmax(logits.double(), -1)
    torch.testing.assert_close(
        entropy_from_logits(logits).double(), -(p * p.log()).sum(-1), atol=1e-6, rtol=0
    )
    uniform = entropy_from_logits(torch.zeros(2, 30))
    torch.testing.assert_close(uniform, torch.full((2,), math.log(30)), atol=1e-6, rtol=0)
    peaked = torch.zeros(30)
    peaked[3] = 1e4
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("chunk_size", [1, 5, 10_000])
def test_top_tokens_and_logprobs_at_given_ids_match_a_full_log_softmax(policy, chunk_size):
    """top_logprobs=k gives each scored position's k largest entries of the full
    log-softmax at the temperature (not truncated by top-k / top-p), logprobs_at gathers it
    at given ids; both are zero where nothing is scored (padding, the last column); the
    gradient through logprobs_at equals the unchunked one."""
    policy.to(torch.float64).train()
    input_ids, mask = right_padded_batch()
    positions = position_ids_from_mask(mask)
    logits = policy(input_ids, attention_mask=mask, position_ids=positions).logits
    full = torch.log_softmax(logits / 0.7, dim=-1)  # (N, S, V) float64 reference
    scored = torch.zeros_like(mask, dtype=torch.bool)
    scored[:, :-1] = mask[:, :-1].bool() & mask[:, 1:].bool()
    values, ids = full.topk(3, dim=-1)
    ask = torch.randint(
        0, full.shape[-1], (*input_ids.shape, 4), generator=torch.Generator().manual_seed(2)
    )
    out = sequence_logprobs(
        policy, input_ids, mask, temperature=0.7, top_k=5, top_p=0.9,
        chunk_size=chunk_size, top_logprobs=3, logprobs_at=ask,
    )  # fmt: skip
    assert out.top_ids.shape == out.top_logprobs.shape == out.logprobs_at.shape[:2] + (3,)
    assert torch.equal(out.top_ids[scored], ids[scored])
    assert not out.top_ids[~scored].any() and not out.logprobs_at[~scored].any()
    # float64 model: only the final cast to float32 rounds (relative 2^-24 of values ~ 10)
    torch.testing.assert_close(out.top_logprobs[scored].double(), values[scored].detach(),
                               atol=1e-5, rtol=0)  # fmt: skip
    expected = full.gather(-1, ask)
    torch.testing.assert_close(out.logprobs_at[scored].double(), expected[scored].detach(),
                               atol=1e-5, rtol=0)  # fmt: skip
    weights = torch.randn(
        ask.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64
    )
    (expected.where(scored[..., None], 0.0) * weights).sum().backward()
    naive_grads = {n: p.grad.clone() for n, p in policy.named_parameters()}
    policy.zero_grad()
    out = sequence_logprobs(policy, input_ids, mask, temperature=0.7, chunk_size=chunk_size,
                            logprobs_at=ask)  # fmt: skip
    (out.logprobs_at.double() * weights).sum().backward()
    for name, grad in naive_grads.items():  # float32 outputs: 1e-6 of the largest entry
        got = dict(policy.named_parameters())[name].grad
        assert (got - grad).abs().max() <= 1e-6 * grad.abs().max(), name
    with pytest.raises(ValueError, match=r"logprobs_at must be \(N, S, k\)"):
        sequence_logprobs(policy, input_ids, logprobs_at=ask[..., 0])

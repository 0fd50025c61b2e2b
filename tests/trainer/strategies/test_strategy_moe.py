"""MoE: router diagnostics on fixed router probabilities (hand-computed), the model layer's
aux loss and router logits, and the aux loss entering the loss and the gradients."""

import math

import pytest
import torch
from strategy_testing import TOKENIZER, build, random_rows, sft_batch
from transformers import AutoModelForCausalLM, MixtralConfig, Qwen2MoeConfig

from ardea.model import sequence_logprobs
from ardea.model.logprobs import sequence_logits
from ardea.model.moe import moe_routing
from ardea.trainer.moe_terms import router_diagnostics

LAYER_1 = [[0.5, 0.3, 0.15, 0.05], [0.4, 0.35, 0.2, 0.05], [0.1, 0.2, 0.6, 0.1]]
LAYER_2 = [[0.1, 0.2, 0.3, 0.4], [0.4, 0.1, 0.2, 0.3], [0.3, 0.4, 0.1, 0.2]]


def entropy(rows) -> float:
    return sum(-sum(p * math.log(p) for p in row) for row in rows) / len(rows)


def as_logits(rows) -> torch.Tensor:
    return torch.tensor(rows).log()  # softmax(log p) = p


def test_router_diagnostics_by_hand():
    # top-2 counts: layer 1 -> [2, 3, 1, 0], ideal 6/4 = 1.5, load [4/3, 2, 2/3, 0];
    #               layer 2 -> [2, 1, 1, 2], load [4/3, 2/3, 2/3, 4/3]
    got = router_diagnostics([as_logits(LAYER_1), as_logits(LAYER_2)], top_k=2)
    assert got["moe/router_entropy"] == pytest.approx((entropy(LAYER_1) + entropy(LAYER_2)) / 2)
    assert got["moe/dead_expert_fraction"] == pytest.approx((1 / 4 + 0) / 2)
    assert got["moe/load_imbalance_mean"] == pytest.approx(((8 / 3) / 4 + (4 / 3) / 4) / 2)
    assert got["moe/load_imbalance_max"] == pytest.approx((2 + 4 / 3) / 2)


def test_router_diagnostics_skip_uncounted_tokens():
    # without the third token: layer 1 counts [2, 2, 0, 0] (ideal 1), layer 2 [1, 0, 1, 2]
    mask = torch.tensor([1, 1, 0])
    got = router_diagnostics([as_logits(LAYER_1), as_logits(LAYER_2)], 2, mask)
    assert got["moe/router_entropy"] == pytest.approx(
        (entropy(LAYER_1[:2]) + entropy(LAYER_2[:2])) / 2
    )
    assert got["moe/dead_expert_fraction"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert got["moe/load_imbalance_mean"] == pytest.approx((1.0 + 0.5) / 2)
    assert got["moe/load_imbalance_max"] == pytest.approx(2.0)


def test_router_diagnostics_top1_and_empty():
    probs = [
        [0.7, 0.1, 0.1, 0.1],
        [0.6, 0.2, 0.1, 0.1],
        [0.1, 0.8, 0.05, 0.05],
        [0.1, 0.1, 0.1, 0.7],
    ]
    got = router_diagnostics([as_logits(probs)], top_k=1)  # counts [2, 1, 0, 1], ideal 1
    assert got["moe/dead_expert_fraction"] == 0.25
    assert got["moe/load_imbalance_mean"] == pytest.approx(0.5)
    assert got["moe/load_imbalance_max"] == pytest.approx(2.0)
    empty = router_diagnostics([as_logits(probs)], 1, torch.zeros(4))
    assert all(math.isfinite(v) for v in empty.values())
    assert router_diagnostics([], top_k=2) == {}


def tiny_moe(family: str, seed: int = 0):
    common = dict(
        vocab_size=len(TOKENIZER),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        pad_token_id=TOKENIZER.pad_token_id,
    )
    if family == "qwen2_moe":
        config = Qwen2MoeConfig(
            **common, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=32
        )
    else:
        config = MixtralConfig(**common, num_local_experts=4)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


BATCH = sft_batch(random_rows([9, 6, 11], seed=1), [4, 2, 7])


@pytest.mark.parametrize("family", ["qwen2_moe", "mixtral"])
def test_model_layer_returns_aux_loss_and_router_logits(family):
    model = tiny_moe(family)
    assert moe_routing(model) == (4, 2)
    ids, attn = BATCH.input_ids, BATCH.attention_mask
    out = sequence_logprobs(model, ids, attn)
    full = model(input_ids=ids, attention_mask=attn, output_router_logits=True)
    torch.testing.assert_close(out.aux_loss, full.aux_loss, atol=1e-6, rtol=1e-6)
    assert len(out.router_logits) == 2
    assert all(r.shape == (ids.numel(), 4) for r in out.router_logits)
    logits_out = sequence_logits(model, ids, attn)
    assert logits_out.logits.shape == (*ids.shape, len(TOKENIZER))
    torch.testing.assert_close(logits_out.aux_loss, full.aux_loss, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_aux_loss_enters_loss_and_gradients(smoothing):
    coef = 0.5
    model = tiny_moe("qwen2_moe")
    loss_off, metrics_off = step_with(model, 0.0, smoothing)
    grads_off = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    loss_on, metrics = step_with(model, coef, smoothing)
    grads_on = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    # the aux loss computed independently by transformers' forward
    aux = model(
        input_ids=BATCH.input_ids,
        attention_mask=BATCH.attention_mask,
        output_router_logits=True,
    ).aux_loss
    assert loss_on.item() - loss_off.item() == pytest.approx(coef * aux.item(), abs=1e-5)
    assert metrics["train/moe_aux_loss"] == pytest.approx(aux.item(), abs=1e-6)
    assert metrics_off["train/moe_aux_loss"] == pytest.approx(aux.item(), abs=1e-6)
    (coef * aux).backward()
    routers = [n for n in grads_on if n.endswith("gate.weight") and "shared" not in n]
    assert len(routers) == 2
    for name in routers:
        difference = grads_on[name] - grads_off[name]
        assert difference.abs().sum() > 0
        torch.testing.assert_close(difference, model.get_parameter(name).grad, atol=1e-6, rtol=1e-5)
    assert 0 < metrics["moe/router_entropy"] <= math.log(4) + 1e-6
    assert 0 <= metrics["moe/dead_expert_fraction"] <= 1
    assert metrics["moe/load_imbalance_max"] >= 1


def step_with(model, coef, smoothing):
    strategy = build("sft", model, moe_aux_loss_coef=coef, label_smoothing=smoothing)
    loss, metrics = strategy.loss(BATCH, strategy.step_counts([BATCH]))
    loss.backward()
    return loss, metrics


def test_moe_metrics_are_token_weighted_over_micro_batches():
    """Two micro-batches: the summed metric is the token-weighted mean of the parts."""
    model = tiny_moe("qwen2_moe")
    strategy = build("sft", model)
    rows = random_rows([9, 6, 11, 5], seed=8)
    parts = [sft_batch(rows[:1], [3]), sft_batch(rows[1:], [2, 4, 1])]
    counts = strategy.step_counts(parts)
    assert counts["routed_tokens"] == 31
    total = sum(strategy.loss(b, counts)[1]["train/moe_aux_loss"] for b in parts)
    each = [
        model(
            input_ids=b.input_ids, attention_mask=b.attention_mask, output_router_logits=True
        ).aux_loss.item()
        for b in parts
    ]
    assert total == pytest.approx((9 * each[0] + 22 * each[1]) / 31, abs=1e-6)


def test_dense_policy_has_no_moe_terms():
    from strategy_testing import tiny_policy

    strategy = build("sft", tiny_policy())
    counts = strategy.step_counts([BATCH])
    _, metrics = strategy.loss(BATCH, counts)
    assert "routed_tokens" not in counts
    assert not any(k.startswith("moe/") or "moe" in k for k in metrics)

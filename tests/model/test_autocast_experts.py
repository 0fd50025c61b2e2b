"""Experts in the compute dtype: under bf16 autocast a model switched by ``follow_autocast``
computes its experts as transformers' grouped experts do on bf16 copies of the weights (its
own implementation computes them in float32, the reason for the switch), gradients reach the
float32 parameters, the cast kept between forwards without gradients follows every update,
and nothing of it is saved."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import transformers
from transformers.integrations.moe import grouped_mm_experts_forward

from ardea.model.autocast_experts import NAME, follow_autocast, forget_casts, keep_casts


def _moe(seed: int = 0, family: str = "qwen3_moe") -> torch.nn.Module:
    """A one-layer MoE: Qwen3-MoE's experts, or gpt-oss's (biases, transposed weights, its
    own clamped gate)."""
    common = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, num_experts_per_tok=2,
                  initializer_range=0.2)  # fmt: skip
    torch.manual_seed(seed)
    if family == "gpt_oss":
        config = transformers.GptOssConfig(**common, intermediate_size=24, num_local_experts=4)
        model = transformers.GptOssForCausalLM(config)
        with torch.no_grad():  # biases start at zero: make them count
            for name, param in model.named_parameters():
                if name.endswith("_bias"):
                    param.normal_(0, 0.2)
        return model.float().eval()
    config = transformers.Qwen3MoeConfig(**common, intermediate_size=64, moe_intermediate_size=24,
                                         num_experts=4)  # fmt: skip
    return transformers.Qwen3MoeForCausalLM(config).float().eval()


def _inputs(experts_count: int = 4, tokens: int = 10):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, 32, generator=gen)
    ids = torch.stack([torch.randperm(experts_count, generator=gen)[:2] for _ in range(tokens)])
    weights = torch.rand(tokens, 2, generator=gen)
    return x, ids, weights


def _bf16_reference(experts, x, ids, weights) -> torch.Tensor:
    """transformers' own grouped experts on bf16 copies of the weights, no autocast."""
    low = copy.deepcopy(experts).to(torch.bfloat16)
    low.__dict__.pop("_ardea_cast_weights", None)
    with torch.no_grad():
        return grouped_mm_experts_forward(low, x.bfloat16(), ids, weights.bfloat16()).float()


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_experts_compute_in_the_autocast_dtype_as_transformers_does_on_bf16_weights(family):
    model = _moe(family=family)
    experts = model.model.layers[0].mlp.experts
    x, ids, weights = _inputs()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        stock = experts(x, ids, weights.bfloat16())  # transformers' grouped_mm: float32
        follow_autocast(model)
        assert experts.config._experts_implementation == NAME
        ours = experts(x, ids, weights.bfloat16())
    reference = _bf16_reference(experts, x, ids, weights)
    assert torch.equal(ours, reference)  # the same function on the same bf16 numbers
    with torch.no_grad():
        exact = grouped_mm_experts_forward(experts, x, ids, weights.bfloat16().float())
    # transformers' own stays float32 (within float32 rounding of the exact sum) where ours
    # rounds to bf16 (relative 2^-9 per rounding, several roundings: visibly more)
    assert (stock - exact).abs().max() <= 1e-5
    assert (ours - exact).abs().max() > 1e-3


def test_gradients_reach_the_float32_parameters():
    model = _moe()
    follow_autocast(model)
    experts = model.model.layers[0].mlp.experts
    x, ids, weights = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        experts(x, ids, weights).square().sum().backward()
    for param in (experts.gate_up_proj, experts.down_proj):
        assert param.grad is not None and param.grad.dtype == torch.float32
        assert param.grad.abs().sum() > 0
    assert getattr(experts, "_ardea_cast_weights", None) is None  # nothing kept with grads


def test_casts_are_kept_only_where_asked_and_until_forgotten():
    """Outside keep_casts every forward casts anew, so any update reaches it — torch's fused
    AdamW included, which does not bump the parameters' version counters; within it the
    cast is kept (a decode step casts nothing) until forget_casts."""
    model = _moe()
    follow_autocast(model)
    experts = model.model.layers[0].mlp.experts
    x, ids, weights = _inputs()

    def run() -> torch.Tensor:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return experts(x, ids, weights.bfloat16())  # as the router gives them

    first = run()
    experts.gate_up_proj.grad = torch.ones_like(experts.gate_up_proj)
    version = experts.gate_up_proj._version
    torch.optim.AdamW([experts.gate_up_proj], lr=0.5, fused=True).step()
    assert experts.gate_up_proj._version == version  # the step went unannounced
    updated = run()
    assert not torch.equal(updated, first)
    assert torch.equal(updated, _bf16_reference(experts, x, ids, weights.bfloat16()))
    with keep_casts():
        assert torch.equal(run(), updated)
        kept = experts._ardea_cast_weights["gate_up_proj"][1]
        with torch.no_grad():
            experts.gate_up_proj.mul_(-1.5)
        assert torch.equal(run(), updated)  # kept: the caller has not said
        assert experts._ardea_cast_weights["gate_up_proj"][1] is kept
        forget_casts(model)
        assert torch.equal(run(), _bf16_reference(experts, x, ids, weights.bfloat16()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_without_autocast_nothing_changes(dtype):
    model = _moe().to(dtype)
    experts = model.model.layers[0].mlp.experts
    x, ids, weights = _inputs()
    x, weights = x.to(dtype), weights.to(dtype)
    with torch.no_grad():
        before = experts(x, ids, weights)
        follow_autocast(model)
        assert torch.equal(experts(x, ids, weights), before)


def test_a_saved_model_loads_with_plain_transformers(tmp_path):
    model = _moe()
    follow_autocast(model)
    model.save_pretrained(tmp_path)
    assert NAME not in json.dumps(json.loads((tmp_path / "config.json").read_text()))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config._experts_implementation == "grouped_mm"

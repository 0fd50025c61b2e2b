"""Routing replay on transformers' own MoE classes (:mod:`ardea.model.routing_replay`).

Nine families, each a tiny random model built from its config: a forward that replays the
routing it recorded is bit-identical to a plain one; replaying other experts makes every
layer choose exactly those for every token (asserted per token) and a token given -1 keep
its own; the router still gets gradients. The Qwen3-MoE block's output under replay is
checked against the family's formula written out here (softmax over the router's logits,
the replayed experts' probabilities renormalised, SwiGLU experts), independent of the code.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
import transformers

from ardea.model import sequence_logprobs
from ardea.model.routing_replay import moe_blocks, record_routing, replay_routing

BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=64)  # fmt: skip
TOP2 = dict(num_experts_per_tok=2)
LINEAR = dict(linear_num_value_heads=2, linear_num_key_heads=1, linear_key_head_dim=16,
              linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"])  # fmt: skip
FAMILIES = {
    "qwen3_moe": ("Qwen3Moe", TOP2 | dict(num_experts=4, moe_intermediate_size=32,
                                          norm_topk_prob=True)),
    "qwen2_moe": ("Qwen2Moe", TOP2 | dict(num_experts=4, moe_intermediate_size=32,
                                          shared_expert_intermediate_size=32)),
    "mixtral": ("Mixtral", TOP2 | dict(num_local_experts=4)),
    "olmoe": ("Olmoe", TOP2 | dict(num_experts=4)),
    "gpt_oss": ("GptOss", TOP2 | dict(num_local_experts=4, sliding_window=8,
                                      layer_types=["sliding_attention", "full_attention"])),
    # grouped routing: 4 experts in 2 groups, tokens limited to 1 group
    "deepseek_v3": ("DeepseekV3", TOP2 | dict(
        n_routed_experts=4, moe_intermediate_size=32, first_k_dense_replace=0, n_group=2,
        topk_group=1, n_shared_experts=1, kv_lora_rank=16, q_lora_rank=16, head_dim=8,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)),
    "glm4_moe": ("Glm4Moe", TOP2 | dict(n_routed_experts=4, moe_intermediate_size=32,
                                        first_k_dense_replace=0, n_group=1, topk_group=1,
                                        n_shared_experts=1)),
    "qwen3_next": ("Qwen3Next", TOP2 | LINEAR | dict(num_experts=4, moe_intermediate_size=32,
                                                     shared_expert_intermediate_size=32)),
    "qwen3_5_moe": ("Qwen3_5MoeText", TOP2 | LINEAR | dict(
        num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=32)),
}  # fmt: skip


def build(family: str, seed: int = 0) -> torch.nn.Module:
    prefix, extra = FAMILIES[family]
    config = getattr(transformers, f"{prefix}Config")(**(BASE | extra))
    model_class = prefix.removesuffix("Text") + "ForCausalLM"
    torch.manual_seed(seed)
    return getattr(transformers, model_class)(config).float().eval()


def other_experts(routes: torch.Tensor, seed: int = 1) -> torch.Tensor:
    """Routes ``(T, L, K)`` of distinct random experts (4 experts), -1 on the first 3 tokens."""
    generator = torch.Generator().manual_seed(seed)
    tokens, layers, k = routes.shape
    picks = [torch.randperm(4, generator=generator)[:k] for _ in range(tokens * layers)]
    out = torch.stack(picks).view(tokens, layers, k).to(routes.dtype)
    out[:3] = -1
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_replay_routes_every_token_to_the_given_experts(family):
    model = build(family)
    ids = torch.randint(2, 96, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(ids).logits
        with record_routing(model) as record:
            recorded = model(ids).logits
        own = record.routes()  # (T, L, K)
        with replay_routing(model, own.view(2, 7, *own.shape[1:])):
            replayed = model(ids).logits
        given = other_experts(own)
        with replay_routing(model, given) as replay:
            moved = model(ids).logits
    assert own.shape == (14, 2, 2)
    assert torch.equal(plain, recorded) and torch.equal(plain, replayed)
    chosen = torch.stack(replay.chosen, dim=1)  # (T, L, K) what each layer used
    assert torch.equal(chosen[3:], given[3:].long())  # every token, every layer
    assert torch.equal(chosen[:3], own[:3].long())  # -1: the layer's own choice
    assert (moved - plain).abs().max() > 1e-3
    # layer 0 sees the plain forward's inputs: its own choice is the recorded one, and the
    # record counts the tokens whose replayed experts differ from it (as sets)
    differ = (given[:, 0].sort(-1).values != own[:, 0].sort(-1).values).any(-1)
    differ[:3] = False  # not replayed
    assert torch.equal(replay.replayed[0], torch.arange(14) >= 3)
    assert torch.equal(replay.changed[0], differ)
    assert 0.0 < float(replay.changed_fraction()) <= 1.0


def test_the_gate_weights_are_the_routers_at_the_replayed_experts():
    model = build("qwen3_moe")
    block = moe_blocks(model)[0]
    hidden = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    given = torch.tensor([[3, 0], [1, 2], [0, 3], [2, 1], [3, 1]])  # (T, K)
    routes = torch.full((5, 2, 2), -1)
    routes[:, 0] = given
    with torch.no_grad(), replay_routing(model, routes):
        out = block(hidden[None])[0]
    with torch.no_grad():
        probs = F.softmax(hidden @ block.gate.weight.T, dim=-1)  # (T, E)
        weights = probs.gather(-1, given)
        weights = weights / weights.sum(-1, keepdim=True)  # norm_topk_prob
        expected = torch.zeros_like(hidden)
        experts = block.experts
        for t in range(5):
            for slot in range(2):
                e = int(given[t, slot])
                gate, up = (experts.gate_up_proj[e] @ hidden[t]).chunk(2)
                expected[t] += weights[t, slot] * (experts.down_proj[e] @ (F.silu(gate) * up))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_the_router_trains_under_replay():
    model = build("mixtral").train()
    ids = torch.randint(2, 96, (1, 6), generator=torch.Generator().manual_seed(0))
    routes = other_experts(torch.zeros(6, 2, 2, dtype=torch.int8))
    out = sequence_logprobs(model, ids, routed_experts=routes[None])
    out.logprobs.sum().backward()
    for block in moe_blocks(model):
        assert block.gate.weight.grad is not None and block.gate.weight.grad.abs().sum() > 0


def test_replay_reaches_only_the_calling_thread():
    model = build("qwen3_moe")
    ids = torch.randint(2, 96, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(ids).logits
        seen = {}
        with replay_routing(model, other_experts(torch.zeros(6, 2, 2, dtype=torch.int8))):
            worker = threading.Thread(target=lambda: seen.setdefault("logits", model(ids).logits))
            worker.start()
            worker.join()
    assert torch.equal(seen["logits"], plain)


def test_routes_that_do_not_fit_the_model_are_errors():
    model = build("qwen3_moe")
    ids = torch.randint(2, 96, (1, 4))
    with pytest.raises(ValueError, match=r"\(MoE layers, experts per token\)"):
        replay_routing(model, torch.zeros(4, 3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="expert id 4 >= the model's 4 experts"):
        replay_routing(model, torch.full((4, 2, 2), 4))
    with pytest.raises(ValueError, match="integer"):
        replay_routing(model, torch.zeros(4, 2, 2))
    with pytest.raises(ValueError, match=r"routes \(4, 2\).*give \(5, 2\)"):
        with torch.no_grad(), replay_routing(model, torch.zeros(5, 2, 2, dtype=torch.long)):
            model(ids)
    dense = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**BASE))
    with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
        record_routing(dense)

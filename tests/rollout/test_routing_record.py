"""The in-process engine records each token's experts (``SamplingParams.routed_experts``)
with continuous batching: rows joining a running batch, the n samples of a prompt prefilled
once. Checked against transformers' own forward of the whole row (float32), and replayed
bit for bit into a forward whose router has moved: every layer then chooses, for every
token, exactly the experts the engine recorded."""

from __future__ import annotations

import copy

import pytest
import torch
from rollout_models import make_model

from ardea.model import sequence_logprobs
from ardea.model.routing_replay import record_routing, replay_routing
from ardea.rollout import InProcessEngine, SamplingParams

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]


def _generate(model, fast: bool = True, **params):
    engine = InProcessEngine(model, pad_token_id=0, eos_token_ids=[1], max_batch_size=3)
    if not fast:  # the Hugging Face forward at every step, recorded through its MoE blocks
        engine._fast = engine._decoder.fast = None
    params = SamplingParams(temperature=1.0, max_new_tokens=6, n=2, seed=3, **params)
    return engine.generate(PROMPTS, params)  # 6 rows, 3 at a time: the others join later


def _row(c) -> torch.Tensor:
    return torch.tensor([c.prompt_ids + c.token_ids])


#: the router probabilities of the engine's incremental forwards and of one full forward
#: differ by at most the log-probs' float32 bound (1e-5, tests/rollout/test_hybrid_models.py)
#: times a probability <= 1; a token's experts can differ only where its 2nd and 3rd most
#: likely experts are closer than twice that
NEAR_TIE = 2e-5


def _min_gap(model, row: torch.Tensor) -> float:
    """The smallest gap between a token's 2nd and 3rd router probabilities, any layer."""
    with torch.no_grad():
        logits = model(row, output_router_logits=True).router_logits
    probs = [torch.softmax(x.float(), -1).sort(-1, descending=True).values for x in logits]
    return min(float((p[:, 1] - p[:, 2]).min()) for p in probs)


@pytest.mark.parametrize("fast", [True, False], ids=["compact-step", "hugging-face-step"])
def test_each_token_carries_the_experts_the_engine_routed_it_to(fast):
    model = make_model("qwen3_moe")
    completions = _generate(model, fast, routed_experts=True)
    for c in completions:
        routes = c.routed_experts  # (P + G, L, K)
        assert routes.shape == (len(c.prompt_ids) + len(c.token_ids), 2, 2)
        assert bool((routes[-1] == -1).all())  # the last token never ran through the model
        # equality below is derived, not lucky: no token is near a tie (about 6e-4 here)
        assert _min_gap(model, _row(c)) > NEAR_TIE
        with torch.no_grad(), record_routing(model) as whole:
            model(_row(c))
        assert torch.equal(routes[:-1], whole.routes()[:-1])
    assert all(c.routed_experts is None for c in _generate(model, fast))


def test_recorded_routing_replays_bit_for_bit_into_a_moved_router():
    model = make_model("qwen3_moe")
    completions = _generate(model, routed_experts=True)
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for layer in moved.model.layers:
            layer.mlp.gate.weight.add_(torch.randn_like(layer.mlp.gate.weight))
    changed = []
    for c in completions:
        routes = c.routed_experts
        with torch.no_grad(), replay_routing(moved, routes) as replay:
            moved(_row(c))
        chosen = torch.stack(replay.chosen, dim=1)  # (P + G, L, K)
        assert torch.equal(chosen[:-1], routes[:-1].long())  # every token, every layer
        changed.append(float(replay.changed_fraction()))
        # the trainer's log-probs with the replay are those of the engine's routing
        out = sequence_logprobs(model, _row(c), routed_experts=routes[None])
        prompt = len(c.prompt_ids)
        engine = torch.tensor(c.logprobs)
        # float32 engine and trainer: the bound of tests/rollout/test_hybrid_models.py
        torch.testing.assert_close(out.logprobs[0, prompt - 1 : -1], engine, atol=1e-5, rtol=0)
        assert _min_gap(model, _row(c)) > NEAR_TIE  # so the trainer routes as the engine did
        assert float(out.routing_changed) == 0.0
    assert max(changed) > 0  # the moved router would have routed some tokens elsewhere


@pytest.mark.parametrize("fast", [True, False], ids=["compact-step", "hugging-face-step"])
def test_a_dense_model_asked_for_routing_fails_the_call(fast):
    with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
        _generate(make_model("qwen3"), fast, routed_experts=True)

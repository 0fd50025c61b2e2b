"""The trainer's log-probs of tokens sampled under top-k / top-p are those of the same
truncated distribution the engine sampled from, so the first update's ratio is 1."""

import math

import pytest
import torch
from tiny_models import small_model

from ardea.model import build_char_tokenizer, sequence_logprobs
from ardea.model.logprobs import truncated
from ardea.rollout import EngineSpec, SamplingParams, make_engine
from ardea.rollout.engines.inprocess.sampling import next_tokens


def test_top_p_by_hand():
    """Probabilities 0.5, 0.3, 0.15, 0.05 at top-p 0.8 keep the first two (mass before the
    third is 0.8): the second token has π = 0.3 / 0.8 = 0.375, which the engine reports and
    the trainer recomputes; the full softmax would give 0.3, a ratio of 0.8."""
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    token, engine = next_tokens(logits, temperature=1.0, top_p=0.8, uniforms=torch.tensor([0.7]))
    assert token.item() == 1 and engine.item() == pytest.approx(math.log(0.375), abs=1e-6)
    trainer = torch.log_softmax(truncated(logits, token, 0, 0.8), -1)[0, 1]
    assert math.exp(trainer - engine.item()) == pytest.approx(1.0, abs=1e-6)
    full = torch.log_softmax(logits, -1)[0, 1]
    assert math.exp(full - engine.item()) == pytest.approx(0.8, abs=1e-6)


def test_the_sampled_token_is_always_kept():
    """A token the trainer's own rounding would drop stays finite (renormalised with it)."""
    z = torch.tensor([[2.0, 1.0, -5.0]])
    lp = torch.log_softmax(truncated(z, torch.tensor([2]), 1, 1.0), -1)[0, 2]
    expected = -5.0 - torch.logsumexp(torch.tensor([2.0, -5.0]), 0)
    assert torch.isfinite(lp) and lp.item() == pytest.approx(expected.item(), abs=1e-6)


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 0.8), (5, 1.0)])
def test_the_first_ratio_is_one_on_the_tiny_model(top_k, top_p):
    """Completions of the in-process engine at top-p 0.8 or top-k 5 (T = 1): the mean
    ratio trainer / behaviour is 1.00 +- 0.01 with the truncation, and far from 1 with the
    full softmax (the bias this fixes)."""
    tokenizer = build_char_tokenizer()
    model = small_model(tokenizer, seed=0).eval()
    engine = make_engine("in_process", EngineSpec.of(model, tokenizer), module=model)
    params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p, max_new_tokens=8,
                            n=16, seed=0)  # fmt: skip
    prompts = [tokenizer(p)["input_ids"] for p in ("12+34=", "5+6=", "99+1=")]
    ratios = {True: [], False: []}
    for c in engine.generate(prompts, params):
        ids = torch.tensor([c.prompt_ids + c.token_ids])
        behaviour = torch.tensor(c.logprobs)
        for same in (True, False):
            options = params.logprob_sampling if same else {"temperature": 1.0}
            with torch.no_grad():
                lp = sequence_logprobs(model, ids, **options).logprobs[0]
            own = lp[len(c.prompt_ids) - 1 : len(c.prompt_ids) - 1 + len(c.token_ids)]
            ratios[same] += (own - behaviour).exp().tolist()
    assert sum(ratios[True]) / len(ratios[True]) == pytest.approx(1.0, abs=0.01)
    assert sum(ratios[False]) / len(ratios[False]) < 0.9

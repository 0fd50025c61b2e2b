"""Hybrid linear-attention models in the in-process engine: Qwen3-Next (gated delta nets
and MoE), Qwen3.5 (gated delta nets) and LFM2 (short convolutions), each a linear layer then
a full-attention layer, built with transformers' own classes. Their cache layers hold per-row
convolution and recurrent states instead of keys and values; the engine selects rows of them
(a prompt's samples prefilled once, rows that stop dropped) and merges them (rows joining a
running batch: test_rollout_requests.py's joining test runs on these families too).

Log-prob tolerance: 1e-5, as the engine's other tests: the same row's float32 forwards in
batches of other shapes differ by rounding of about 1e-7 per op over 2 layers; the
reference is one full forward of prompt + completion, which also checks that the left
padding of shorter prompts leaves the linear layers' states alone.
"""

from __future__ import annotations

import pytest
import torch
from rollout_models import EOS, HYBRID, PAD, make_model

from ardea.rollout import InProcessEngine, SamplingParams

PROMPTS = [[5, 6, 7], [8, 9], [20, 21, 22, 23], [30, 31, 32, 33, 34, 35], [40]]
TOL = 1e-5


def engine_for(model, **kwargs) -> InProcessEngine:
    return InProcessEngine(model, pad_token_id=PAD, eos_token_ids=[EOS], **kwargs)


def worst_gap(model, completions) -> float:
    """The largest |engine − full forward| log-prob over every token of ``completions``."""
    worst = 0.0
    for c in completions:
        ids = torch.tensor([c.prompt_ids + c.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(c.prompt_ids) - 1 : -1].float()
        own = torch.log_softmax(logits, -1).gather(-1, ids[0, len(c.prompt_ids) :, None])[:, 0]
        worst = max(worst, (torch.tensor(c.logprobs) - own).abs().max().item())
    return worst


@pytest.mark.parametrize("arch", sorted(HYBRID))
def test_samples_of_a_prompt_and_rows_that_stop_early_keep_their_states(arch):
    """Three samples of each prompt (its prefill shared, then its rows selected three
    times), six of the 96 tokens stopping rows (dropped from the batch as they end):
    every log-prob is the full forward's."""
    model = make_model(arch)
    stops = list(range(2, 8))  # about 1 in 16 tokens
    params = SamplingParams(temperature=1.0, max_new_tokens=10, stop_token_ids=stops, seed=3, n=3)
    completions = engine_for(model).generate(PROMPTS, params)
    assert len(completions) == 15
    assert {c.finish_reason for c in completions} == {"stop", "length"}  # rows were dropped
    assert worst_gap(model, completions) <= TOL

"""Requests on a real vLLM server (CPU build): streamed, aborted with the tokens so far,
resumed from them, and continued under new weights when an update comes while they run.

Tolerance 1e-5 on log-probs, as this folder's other tests: the server and the trainer both
compute in float32 (different kernels), and the gaps measured there are below 1e-6."""

from __future__ import annotations

import threading

import pytest
import torch
from vllm_testing import TOKENIZER, engine_on, tiny

from ardea.rollout import Request, SamplingParams
from ardea.rollout.engines.vllm import requests as vllm_requests

pytestmark = pytest.mark.slow  # a real vLLM server

PROMPT = TOKENIZER("12+34=")["input_ids"]
LONG = 120  # tokens: long enough that an update or an abort lands while it runs


@pytest.fixture
def held_after_ten(monkeypatch):
    """The first request streams 10 tokens, then waits until it is told to stop (an abort or a
    weight update closes them): the server may be far ahead of its reader, so without this
    the whole completion could arrive before the test stops it. Waits until a request is
    held; the server is real, only the reader is slowed."""
    original = vllm_requests.Running.extend
    held = threading.Event()

    def extend(self, tokens, logprobs, version):
        original(self, tokens, logprobs, version)
        if len(self.tokens) >= 10 and not held.is_set():  # the first request, once
            held.set()
            assert self.stop.wait(60), "nothing stopped the held request"

    monkeypatch.setattr(vllm_requests.Running, "extend", extend)
    return lambda: held.wait(60)


def masked(model, tokens: list[int], stops: list[int]) -> tuple[list[int], torch.Tensor]:
    """Reference from one full forward of PROMPT + ``tokens``, the ``stops`` masked out (the
    requests set min_new_tokens to all their tokens): the argmax before each token, and each
    token's float64 log-prob."""
    with torch.no_grad():
        ids = torch.tensor([PROMPT + tokens])
        logits = model(input_ids=ids).logits.double()[0, len(PROMPT) - 1 : -1]
    logits[:, stops] = float("-inf")
    logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
    return logits.argmax(-1).tolist(), logp


def test_an_aborted_vllm_request_resumes_from_its_tokens(vllm_url, tmp_path, held_after_ten):
    model = tiny(seed=4)
    engine = engine_on(vllm_url, model, tmp_path)
    try:
        params = SamplingParams(temperature=1.0, max_new_tokens=LONG, min_new_tokens=LONG, seed=3)
        handle = engine.submit(Request(PROMPT, params, 7))
        assert held_after_ten()
        (partial,) = engine.abort([handle])
        assert partial.finish_reason == "abort" and 10 <= len(partial.token_ids) < LONG
        done = engine.submit(Request(PROMPT, params, 7, prefix=partial)).result(timeout=120)
        assert (
            len(done.token_ids) == LONG
            and done.token_ids[: len(partial.token_ids)] == partial.token_ids
        )
        assert done.spans == [(0, 0)] and done.finish_reason == "length"
        # every log-prob is the policy's, stop tokens masked out (min_new_tokens = LONG)
        _, expected = masked(model, done.token_ids, engine.stop_token_ids)
        assert (expected - torch.tensor(done.logprobs, dtype=torch.float64)).abs().max() < 1e-5
    finally:
        engine.close()


def test_an_update_during_a_vllm_request_continues_it_under_the_new_weights(
    vllm_url, tmp_path, held_after_ten
):
    """update_weights does not wait for a running request: it is stopped between two tokens
    and goes on under the new weights; every token is the greedy token, and carries the
    log-prob, of the weights of its span."""
    old, new = tiny(seed=5), tiny(seed=6)
    engine = engine_on(vllm_url, tiny(seed=5), tmp_path)
    try:
        params = SamplingParams(temperature=0.0, max_new_tokens=LONG, min_new_tokens=LONG)
        handle = engine.submit(Request(PROMPT, params))
        assert held_after_ten()
        engine.update_weights({k: v.clone() for k, v in new.state_dict().items()}, 1)
        done = handle.result(timeout=120)
        assert engine.version == 1 and len(done.token_ids) == LONG
        (_, first), (k, second) = done.spans  # cut after the 10 or more tokens streamed
        assert (first, second) == (0, 1) and 10 <= k < LONG
        versions, stops = done.token_versions, engine.stop_token_ids
        reference = {v: masked((old, new)[v], done.token_ids, stops) for v in set(versions)}
        assert done.token_ids == [reference[v][0][i] for i, v in enumerate(versions)]
        served = torch.tensor(done.logprobs, dtype=torch.float64)
        for v in set(versions):
            at = torch.tensor([i for i, w in enumerate(versions) if w == v])
            assert (reference[v][1][at] - served[at]).abs().max() < 1e-5
        metrics = engine.metrics()  # two segments, one request, every token counted
        assert metrics["vllm/server0_requests"] == 1
        assert metrics["vllm/server0_tokens"] == LONG
    finally:
        engine.close()

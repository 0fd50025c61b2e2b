"""The in-process engine's requests: continuous batching, abort, resume, spans of versions.

Log-prob tolerance: 1e-5, as the engine's batch-invariance tests: float32 forwards of the
same row in different batches (other padding, other matmul shapes) differ by rounding of
about 1e-7 per op over a 2-layer model; a token itself must be equal.
"""

from __future__ import annotations

import pytest
import torch
from rollout_models import EOS, HYBRID, PAD, make_model

from ardea.rollout import InProcessEngine, Request, SamplingParams

PROMPTS = [[5, 6, 7], [8, 9], [20, 21, 22, 23], [30, 31, 32, 33, 34, 35], [40]]
TOL = 1e-5


def engine_for(model, **kwargs) -> InProcessEngine:
    return InProcessEngine(model, pad_token_id=PAD, eos_token_ids=[EOS], **kwargs)


def forward_logprobs(model, prompt, tokens, temperature=1.0) -> torch.Tensor:
    """Reference: log_softmax(logits / T) of a full forward, at each of ``tokens``, with the
    stop token masked out (the requests here set min_new_tokens = max_new_tokens)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logits[:, EOS] = float("-inf")
    logp = torch.log_softmax(logits / temperature, dim=-1)
    start = len(prompt) - 1
    return logp[start : start + len(tokens)].gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def close(a, b) -> bool:
    return len(a) == len(b) and max((abs(x - y) for x, y in zip(a, b)), default=0.0) <= TOL


@pytest.mark.parametrize("arch", ["qwen2", *HYBRID])
def test_requests_joining_at_different_steps_sample_what_one_batch_call_does(arch):
    """Rows submitted while others run (and with a batch cap, so some wait for a free
    slot) give the tokens of one batch call with the same seed and row ids; they join the
    running rows' batch (a hybrid model's linear-attention states stacked by row beside the
    attention layers' right-aligned keys: tests/rollout/test_hybrid_models.py)."""
    model = make_model(arch)
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=11)
    rows = list(range(len(PROMPTS)))
    batch = engine_for(model).generate(PROMPTS, SamplingParams(**{**vars(params), "row_ids": rows}))
    engine = engine_for(model, max_batch_size=3)
    first = [engine.submit(Request(PROMPTS[i], params, i)) for i in (0, 1)]
    first[0].result(timeout=60)  # the others join a batch that has decoded for a while
    later = [engine.submit(Request(PROMPTS[i], params, i)) for i in (2, 3, 4)]
    for handle, expected in zip(first + later, batch, strict=True):
        got = handle.result(timeout=60)
        assert got.token_ids == expected.token_ids
        assert close(got.logprobs, expected.logprobs)
        assert got.spans == [(0, 0)] and got.finish_reason == expected.finish_reason
    assert engine._merge_ok is True  # joined running rows, not a batch of their own


def test_a_resumed_completion_continues_exactly_under_the_same_weights():
    """A request stopped at once (any number of tokens) and resubmitted with its tokens as
    prefix ends with the tokens and log-probs of the uninterrupted request."""
    model = make_model("qwen2")
    params = SamplingParams(temperature=1.0, max_new_tokens=40, min_new_tokens=40, seed=3)
    whole = engine_for(model).submit(Request(PROMPTS[3], params, 5)).result(timeout=60)
    engine = engine_for(model)
    handle = engine.submit(Request(PROMPTS[3], params, 5))
    (partial,) = engine.abort([handle])
    assert partial.finish_reason == "abort" and len(partial.token_ids) < 40
    assert partial.token_ids == whole.token_ids[: len(partial.token_ids)]
    resumed = engine.submit(Request(PROMPTS[3], params, 5, prefix=partial)).result(timeout=60)
    assert resumed.token_ids == whole.token_ids and close(resumed.logprobs, whole.logprobs)
    assert resumed.spans == [(0, 0)]


def test_a_completion_resumed_under_new_weights_has_two_spans_with_each_parts_logprobs():
    """Cut after k tokens under version 0 and resumed under version 1: spans [(0, 0), (k, 1)];
    the first k log-probs are those of a fresh forward under the old weights, the rest of a
    fresh forward of prompt + all tokens under the new ones (its cache recomputed)."""
    old, new = make_model("qwen2", seed=0), make_model("qwen2", seed=1)
    k, total = 7, 20
    engine = engine_for(make_model("qwen2", seed=0))
    params = SamplingParams(temperature=0.8, max_new_tokens=total, min_new_tokens=total, seed=2)
    cut = SamplingParams(**{**vars(params), "max_new_tokens": k, "min_new_tokens": k})
    part = engine.submit(Request(PROMPTS[0], cut, 4)).result(timeout=60)
    engine.update_weights(new.state_dict(), 1)
    done = engine.submit(Request(PROMPTS[0], params, 4, prefix=part)).result(timeout=60)
    assert done.spans == [(0, 0), (k, 1)] and done.version == 0
    assert done.token_versions == [0] * k + [1] * (total - k)
    assert done.token_ids[:k] == part.token_ids
    assert close(done.logprobs[:k], forward_logprobs(old, PROMPTS[0], part.token_ids, 0.8).tolist())
    fresh = forward_logprobs(new, PROMPTS[0], done.token_ids, 0.8)
    assert close(done.logprobs[k:], fresh[k:].tolist())
    # the new part samples the old run's random numbers at positions k.. (row 4, seed 2)
    alone_new = engine_for(new).submit(Request(PROMPTS[0], params, 4, prefix=part)).result(60)
    assert alone_new.token_ids == done.token_ids


def test_an_update_during_a_request_relabels_only_the_tokens_after_it():
    """update_weights while a long request runs does not wait for it: the request goes on
    under the new weights; every token is the greedy token of the weights of its span."""
    old, new = make_model("qwen2", seed=0), make_model("qwen2", seed=1)
    engine = engine_for(make_model("qwen2", seed=0))
    params = SamplingParams(temperature=0, max_new_tokens=60, min_new_tokens=60)
    handle = engine.submit(Request(PROMPTS[1], params))
    engine.update_weights(new.state_dict(), 1)
    done = handle.result(timeout=60)
    assert engine.version == 1 and done.spans[-1][1] == 1 and len(done.token_ids) == 60
    ids = torch.tensor([done.prompt_ids + done.token_ids])
    with torch.no_grad():
        greedy = {
            v: m(input_ids=ids).logits[0, 1:-1].argmax(-1).tolist()
            for v, m in enumerate((old, new))
        }
    expected = [greedy[v][i] for i, v in enumerate(done.token_versions)]
    assert done.token_ids == expected


def test_abort_of_running_waiting_and_finished_requests():
    """Abort stops queued requests before any step (no tokens, the engine's version) and
    hands back a finished request's completion unchanged. The engine is held while the
    requests are submitted, so no step can run before the abort (the condition is
    reentrant, so abort may take it again)."""
    engine = engine_for(make_model("qwen2"), max_batch_size=1)
    params = SamplingParams(temperature=0, max_new_tokens=30, min_new_tokens=30)
    with engine._loop.exclusively():
        handles = [engine.submit(Request(p, params)) for p in PROMPTS[:2]]
        a, b = engine.abort(handles)
    assert a.finish_reason == b.finish_reason == "abort"
    assert a.token_ids == b.token_ids == [] and a.spans == b.spans == [(0, 0)]
    quick = engine.submit(Request(PROMPTS[2], SamplingParams(temperature=0, max_new_tokens=3)))
    finished = quick.result(timeout=60)
    (again,) = engine.abort([quick])
    assert again == finished and finished.finish_reason in ("stop", "length")


def test_submit_all_and_wait_sample_what_one_batch_call_does():
    """Requests submitted together (mixed seeds and max_new_tokens) and waited for in this
    thread: each gives the tokens and log-probs of a batch call of its own seed and length
    at its row id; done callbacks run once each, also one added after the end."""
    model = make_model("qwen2")
    engine = engine_for(model)
    a = SamplingParams(temperature=1.0, max_new_tokens=12, min_new_tokens=12, seed=3)
    b = SamplingParams(temperature=1.0, max_new_tokens=7, min_new_tokens=7, seed=4)
    requests = [Request(PROMPTS[i], a if i % 2 else b, row_id=i) for i in range(len(PROMPTS))]
    handles = engine.submit_all(requests)
    called = []
    handles[0].add_done_callback(lambda h: called.append(h))
    got = engine.wait(handles)
    handles[1].add_done_callback(lambda h: called.append(h))
    assert called == [handles[0], handles[1]]
    reference = engine_for(model)
    for request, completion in zip(requests, got, strict=True):
        params = SamplingParams(**{**vars(request.params), "row_ids": [request.row_id]})
        (expected,) = reference.generate([request.prompt_ids], params)
        assert completion.token_ids == expected.token_ids
        assert len(completion.token_ids) == request.params.max_new_tokens
        assert close(completion.logprobs, expected.logprobs)


def test_an_engine_answering_batches_only_serves_submit_all_with_its_generate():
    """The base class's submit_all on an engine with generate only: one generate call per
    distinct sampling options, each request at its own row id, done handles in order."""
    from ardea.rollout import GenerationEngine

    model = make_model("qwen2")
    inner = engine_for(model)
    calls = []

    class BatchOnly(GenerationEngine):
        version, max_context, stop_token_ids = 0, None, [EOS]

        def generate(self, prompts, params):
            calls.append(list(params.row_ids))
            return inner.generate(prompts, params)

        def update_weights(self, weights, version):
            raise NotImplementedError

    a = SamplingParams(temperature=1.0, max_new_tokens=6, seed=5)
    b = SamplingParams(temperature=1.0, max_new_tokens=6, seed=6)
    requests = [Request(PROMPTS[0], a, 2), Request(PROMPTS[1], b, 0), Request(PROMPTS[2], a, 7)]
    handles = BatchOnly().submit_all(requests)
    assert all(h.done() for h in handles) and calls == [[2, 7], [0]]
    for request, handle in zip(requests, handles):
        expected = inner.wait(inner.submit_all([request]))[0]
        assert handle.result().token_ids == expected.token_ids


def test_completions_are_timed_from_submission_and_the_tail_is_the_slowest_tenth():
    """A 2-token and a 40-token request submitted together: the short one ends first.
    tail_seconds by hand: 10 finish times 1..9 and 30 s: 90 % were done at 9 s, the last
    at 30 s, so 21 s."""
    from ardea.rollout.runner import tail_seconds

    engine = engine_for(make_model("qwen2"))
    short = SamplingParams(temperature=1.0, max_new_tokens=2, min_new_tokens=2, seed=1)
    long = SamplingParams(temperature=1.0, max_new_tokens=40, min_new_tokens=40, seed=1)
    a, b = engine.wait(engine.submit_all([Request(PROMPTS[0], short), Request(PROMPTS[1], long)]))
    assert 0 < a.seconds < b.seconds
    assert tail_seconds([1, 2, 3, 4, 5, 6, 7, 8, 9, 30]) == 21
    assert tail_seconds([]) == 0.0 and tail_seconds([4.0]) == 0.0

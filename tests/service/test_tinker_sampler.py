"""The Tinker server's samplers: an evicted one finishes what it was asked, then closes."""

import copy
import time
from concurrent.futures import Future

from ardea.service.tinker_fields import Fields
from ardea.service.tinker_sampler import Sampler, SamplerCache
from tests.tiny_models import small_model


def test_an_evicted_sampler_finishes_its_requests_then_closes(tokenizer):
    model = small_model(tokenizer).eval().requires_grad_(False)
    cache = SamplerCache(size=1)
    first = cache.get("first", lambda: Sampler(model, tokenizer))
    params = first.params([5, 6], Fields({"max_tokens": 30, "seed": 0}, "sampling_params"), 4)
    results: Future = Future()
    first.submit([5, 6], params, results.set_result, results.set_exception)
    cache.get("second", lambda: Sampler(copy.deepcopy(model), tokenizer))  # evicts the first
    completions = results.result(60)
    assert len(completions) == 4 and all(c.finish_reason in ("stop", "length") for c in completions)
    deadline = time.monotonic() + 30
    while True:  # it closes on a thread of its own once the call is done
        try:
            first.engine.generate([[5, 6]], params)
        except RuntimeError as exc:
            assert "closed" in str(exc)
            break
        assert time.monotonic() < deadline, "the evicted sampler's engine was never closed"
    cache.close()

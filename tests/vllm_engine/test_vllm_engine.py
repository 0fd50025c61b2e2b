"""rollout.engine=vllm against a real vLLM server (CPU build): token-level generation with
behaviour log-probs, weight updates (tied heads included), and failures within timeouts."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import torch
from vllm_testing import TOKENIZER, engine_on, hf_greedy, recomputed, tiny

from ardea.rollout import SamplingParams
from ardea.rollout.engines.vllm.server import VLLMServerError

pytestmark = pytest.mark.slow  # a real vLLM server (its start alone takes ~30 s)

PROMPTS = [TOKENIZER("12+34=")["input_ids"], TOKENIZER("5+6=")["input_ids"]]
STOPS = [TOKENIZER.eos_token_id, TOKENIZER.convert_tokens_to_ids("<|im_end|>")]


def test_completions_carry_the_log_probs_the_trainer_recomputes(vllm_url, tmp_path):
    """fp32 on both sides: the engine's behaviour log-probs at T = 1 and T = 0.7 are the
    policy's log_softmax(logits / T) of the sampled tokens to float32 rounding."""
    model = tiny(seed=1)
    engine = engine_on(vllm_url, model, tmp_path)
    try:
        assert engine.max_context == 256 and engine.stop_token_ids == sorted(STOPS)
        for temperature in (1.0, 0.7):
            params = SamplingParams(temperature=temperature, max_new_tokens=8, n=3, seed=5)
            out = engine.generate(PROMPTS, params)
            assert len(out) == 6 and [c.prompt_ids for c in out[:3]] == [PROMPTS[0]] * 3
            for c in out:
                assert c.version == 0 and 1 <= len(c.token_ids) <= 8
                assert (c.finish_reason == "stop") == (c.token_ids[-1] in STOPS)
                expected = recomputed(model, c.prompt_ids, c.token_ids, temperature)
                gap = (expected - torch.tensor(c.logprobs, dtype=torch.float64)).abs().max()
                assert gap < 1e-5
        again = engine.generate(PROMPTS, params)
        assert [c.token_ids for c in again] == [c.token_ids for c in out]  # seeded
    finally:
        engine.close()


def test_a_split_call_samples_what_one_call_would(vllm_url, tmp_path):
    engine = engine_on(vllm_url, tiny(seed=1), tmp_path)
    try:
        params = SamplingParams(temperature=1.0, max_new_tokens=6, n=2, seed=9)
        whole = engine.generate(PROMPTS, params)
        second = engine.generate(
            PROMPTS[1:], SamplingParams(**{**params.__dict__, "row_ids": [2, 3]})
        )
        assert [c.token_ids for c in second] == [c.token_ids for c in whole[2:]]
    finally:
        engine.close()


def test_a_stop_string_ends_a_vllm_completion_where_the_text_completes_it(vllm_url, tmp_path):
    """Greedy with a stop string taken from the free completion's text: vLLM returns the
    tokens through the one completing it (the shortest prefix whose text holds it, found
    by a plain loop here), finish reason stop, as ardea's in-process engine does."""
    engine = engine_on(vllm_url, tiny(seed=1), tmp_path)
    try:
        greedy = dict(temperature=0.0, max_new_tokens=12)
        free = engine.generate(PROMPTS[:1], SamplingParams(**greedy))[0]
        text = TOKENIZER.decode(free.token_ids, skip_special_tokens=False)
        assert len(free.token_ids) >= 6, text
        stop = TOKENIZER.decode(free.token_ids[3:5], skip_special_tokens=False)
        want = next(
            free.token_ids[:k]
            for k in range(1, len(free.token_ids) + 1)
            if stop in TOKENIZER.decode(free.token_ids[:k], skip_special_tokens=False)
        )
        (cut,) = engine.generate(PROMPTS[:1], SamplingParams(**greedy, stop=[stop]))
        assert cut.token_ids == want and cut.finish_reason == "stop", (text, stop)
    finally:
        engine.close()


@pytest.mark.parametrize("tied", [False, True])
def test_a_weight_update_changes_greedy_output_as_transformers_predicts(vllm_url, tmp_path, tied):
    """After update_weights the server's greedy completions are plain argmax decoding of the
    new weights; a tied head is reloaded too (a directory saved by save_pretrained leaves
    lm_head.weight out, and vLLM would keep its old head)."""
    model = tiny(seed=2, tie_word_embeddings=tied)
    engine = engine_on(vllm_url, model, tmp_path)
    try:
        greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
        before = [c.token_ids for c in engine.generate(PROMPTS, greedy)]
        assert before == [hf_greedy(model, p, 8, STOPS) for p in PROMPTS]
        trained = tiny(seed=3, tie_word_embeddings=tied)
        saved = tmp_path / "trained"
        trained.save_pretrained(saved)
        model.load_state_dict(trained.state_dict())  # the probe reads the live policy
        engine.update_weights(saved, 1)
        assert engine.metrics()["vllm/sync_logprob_error"] < 1e-4
        after = engine.generate(PROMPTS, greedy)
        assert [c.version for c in after] == [1, 1]
        assert [c.token_ids for c in after] == [hf_greedy(trained, p, 8, STOPS) for p in PROMPTS]
        # the log-probs are the new weights' (the head's too), not the old ones'
        sampled = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, seed=1))
        old = tiny(seed=2, tie_word_embeddings=tied)
        for c in sampled:
            served = torch.tensor(c.logprobs, dtype=torch.float64)
            assert (recomputed(trained, c.prompt_ids, c.token_ids) - served).abs().max() < 1e-5
            assert (recomputed(old, c.prompt_ids, c.token_ids) - served).abs().max() > 1e-3
    finally:
        engine.close()


def test_a_sync_that_did_not_take_is_an_error(vllm_url, tmp_path, monkeypatch):
    """The probe compares the servers with the policy: a reload that silently did nothing
    (patched to skip the servers, as a server keeping its old weights would) fails the
    update, and the version is not published."""
    engine = engine_on(vllm_url, tiny(seed=1), tmp_path)
    try:
        monkeypatch.setattr(engine, "_reload_all", lambda: None)
        with pytest.raises(VLLMServerError, match="sync_tolerance"):
            engine.update_weights(tiny(seed=5).state_dict(), 1)
        assert engine.version == 0
    finally:
        engine.close()


def test_a_server_that_never_answers_fails_within_the_timeout(tmp_path):
    """A loopback stub that accepts connections and never replies (a stub: a real server
    cannot be made to hang on purpose): the engine's first call fails after timeout_s,
    naming the server."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held = []
    threading.Thread(target=lambda: held.append(listener.accept()), daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    start = time.monotonic()
    with pytest.raises(VLLMServerError, match=f"{url} did not answer.*within 2 s"):
        engine_on(url, tiny(), tmp_path, timeout_s=2.0)
    assert time.monotonic() - start < 10
    listener.close()


def test_a_refused_connection_names_the_server(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(VLLMServerError, match=f"http://127.0.0.1:{port} failed"):
        engine_on(f"http://127.0.0.1:{port}", tiny(), tmp_path, timeout_s=2.0)


def test_a_launched_server_that_dies_is_restarted_on_the_current_weights(tmp_path):
    """launch=true: the engine starts its own server, and the weights travel in the reload
    request (weight_transport=http: greedy output after the update is the new weights');
    killed after a weight update, it is restarted once (max_restarts=1) on the weights
    last written and the call goes on with them; killed again with no restart left, the
    call fails naming the server."""
    import os
    import signal

    from vllm_testing import PYTHON

    from ardea.rollout import EngineSpec, make_engine

    model = tiny(seed=1)
    options = {"launch": True, "python": str(PYTHON), "timeout_s": 60.0, "max_restarts": 1,
               "max_model_len": 256, "weight_transport": "http"}  # fmt: skip
    engine = make_engine("vllm", EngineSpec.of(model, TOKENIZER, options=options, work_dir=tmp_path), module=model)  # fmt: skip
    try:
        model.load_state_dict(tiny(seed=6).state_dict())
        engine.update_weights(model.state_dict(), 1)
        greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
        expected = [hf_greedy(model, p, 8, STOPS) for p in PROMPTS]
        server = engine.pool.servers[0]
        os.killpg(server.launched.process.pid, signal.SIGKILL)
        server.launched.process.wait(timeout=30)
        out = engine.generate(PROMPTS, greedy)
        assert server.restarts == 1 and [c.token_ids for c in out] == expected
        assert [c.version for c in out] == [1, 1]
        url = engine.urls[0]
        os.killpg(server.launched.process.pid, signal.SIGKILL)
        server.launched.process.wait(timeout=30)
        with pytest.raises(
            VLLMServerError, match=f"every vLLM server .* {url} failed a generation"
        ):
            engine.generate(PROMPTS, greedy)
    finally:
        engine.close()
    assert not server.launched.alive


def test_weights_over_http_need_the_extension(vllm_url, tmp_path):
    """weight_transport=http on a server started without ardea's worker extension: the
    first reload fails naming the flag to start it with."""
    with pytest.raises(VLLMServerError, match="--worker-extension-cls ardea_weights.WeightUpload"):
        engine_on(vllm_url, tiny(), tmp_path, weight_transport="http")

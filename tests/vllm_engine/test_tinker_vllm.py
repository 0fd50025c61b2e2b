"""The Tinker server sampling on vLLM (engine="vllm", what `ardea serve --tinker --engine vllm`
builds) driven by the real ``tinker`` SDK: an SFT step, samples whose log-probs are the
trained LoRA policy's, an importance_sampling step on those log-probs (ratio 1), the
adapter alone synced to the server, the base model as zero adapters, a saved state that
resumes onto the same samples, and a LoRA on the LM head (which vLLM does not take as an
adapter) synced as merged weights. On the session's vLLM server (rollout.vllm.urls); and the
command line launching a server of its own, with an inflight sampling client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from tinker import types
from vllm_testing import PYTHON, TOKENIZER, hf_greedy, recomputed, tiny, write_model_dir

from ardea.rollout import stop_token_ids
from ardea.rollout.engines.vllm.server import free_port
from ardea.service.tinker_server import TinkerServer

pytestmark = pytest.mark.slow  # a real vLLM server

RANK = 4
PROMPT = TOKENIZER.encode("12+3", add_special_tokens=False)
TEXTS = ("12+30=42", "7+8=15;;", "99+1=100")


@pytest.fixture(scope="module")
def running(vllm_url, tmp_path_factory):
    root = tmp_path_factory.mktemp("tinker_vllm")
    options = {"urls": [vllm_url], "timeout_s": 60.0, "sync_tolerance": 1e-4}
    with TinkerServer({"tiny": write_model_dir(root / "base")}, state_dir=root / "state",
                      engine="vllm", engine_options=options) as server:  # fmt: skip
        with tinker.ServiceClient(base_url=server.url, api_key="tml-test") as service:
            yield server, service


@pytest.fixture(scope="module", autouse=True)
def no_telemetry():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINKER_TELEMETRY", "0")
        yield


def sft_data():
    data = []
    for text in TEXTS:
        ids = TOKENIZER.encode(text, add_special_tokens=False)
        weights = [0.0] * 3 + [1.0] * (len(ids) - 4)
        data.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                                loss_fn_inputs={"target_tokens": ids[1:], "weights": weights}))  # fmt: skip
    return data


def rl_data(result, advantages):
    """Datums of the samples: their tokens after the prompt, the sampler's log-probs."""
    data = []
    for seq, advantage in zip(result.sequences, advantages):
        ids, n = PROMPT + seq.tokens, len(PROMPT) - 1
        data.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={
            "target_tokens": ids[1:], "logprobs": [0.0] * n + list(seq.logprobs),
            "advantages": [0.0] * n + [advantage] * len(seq.tokens)}))  # fmt: skip
    return data


def merged(server, model_id):
    _, model = server.service.model(model_id)
    return model.merged_copy()


def test_an_sdk_loop_samples_and_trains_on_vllm(running):
    server, service = running
    trainer = service.create_lora_training_client(base_model="tiny", rank=RANK, seed=5,
                                                  train_unembed=False).result()  # fmt: skip
    trainer.forward_backward(sft_data(), "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    policy = merged(server, trainer.model_id)

    sampler = trainer.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=3)
    result = sampler.sample(types.ModelInput.from_ints(PROMPT), 4, params).result()
    for seq in result.sequences:  # the trained policy's distribution, sampled on vLLM
        ours = recomputed(policy, PROMPT, seq.tokens).numpy()
        np.testing.assert_allclose(seq.logprobs, ours, atol=1e-4)
    engine = server.service.engines.slots[next(iter(server.service.served))].engine
    named = dict(trainer_policy(server, trainer.model_id).named_parameters())
    adapter_bytes = sum(p.numel() * p.element_size() for n, p in named.items() if "lora_" in n)

    data = rl_data(result, [1.0, -1.0, 0.5, -0.5])
    out = trainer.forward_backward(data, "importance_sampling").result()
    for output, seq in zip(out.loss_fn_outputs, result.sequences):
        trained = output["logprobs"].to_numpy()[-len(seq.tokens) :]  # ratio 1: same weights
        np.testing.assert_allclose(trained, seq.logprobs, atol=1e-4)
    trainer.optim_step(types.AdamParams(learning_rate=2e-2)).result()

    after = trainer.save_weights_and_get_sampling_client().result()
    again = after.sample(types.ModelInput.from_ints(PROMPT), 2, params).result()
    policy = merged(server, trainer.model_id)
    for seq in again.sequences:
        np.testing.assert_allclose(seq.logprobs, recomputed(policy, PROMPT, seq.tokens), atol=1e-4)
    assert engine.metrics()["vllm/sync_bytes"] == adapter_bytes  # the adapter alone
    assert engine.metrics()["vllm/sync_logprob_error"] < 1e-4

    state = trainer.save_state("two").result().path
    resumed = service.create_training_client_from_state_with_optimizer(state).result()
    twin = resumed.save_weights_and_get_sampling_client().result()
    same = twin.sample(types.ModelInput.from_ints(PROMPT), 2, params).result()
    assert [s.tokens for s in same.sequences] == [s.tokens for s in again.sequences]
    np.testing.assert_allclose([s.logprobs for s in same.sequences],
                               [s.logprobs for s in again.sequences], atol=1e-5)  # fmt: skip


def trainer_policy(server, model_id):
    return server.service.model(model_id)[1].policy


def test_the_base_model_samples_as_zero_adapters(running):
    _, service = running
    sampler = service.create_sampling_client(base_model="tiny").result()
    base, prompt = tiny(), types.ModelInput.from_ints(PROMPT)
    greedy = types.SamplingParams(max_tokens=6, temperature=0.0)
    tokens = sampler.sample(prompt, 1, greedy).result().sequences[0].tokens
    assert tokens == hf_greedy(base, PROMPT, 6, stop_token_ids(base, TOKENIZER))
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=9)
    for seq in sampler.sample(prompt, 3, params).result().sequences:
        np.testing.assert_allclose(seq.logprobs, recomputed(base, PROMPT, seq.tokens), atol=1e-4)
    scored = sampler.compute_logprobs(prompt).result()
    np.testing.assert_allclose(scored[1:], recomputed(base, PROMPT[:1], PROMPT[1:]), atol=1e-5)


def test_an_adapted_lm_head_reaches_vllm_as_merged_weights(running):
    """The SDK's default layout adapts the LM head, which vLLM takes no adapter on: the
    engine is rebuilt without adapters and each new snapshot syncs the merged model."""
    server, service = running
    trainer = service.create_lora_training_client(base_model="tiny", rank=RANK, seed=6).result()
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=2)
    for _ in range(2):
        trainer.forward_backward(sft_data(), "cross_entropy").result()
        trainer.optim_step(types.AdamParams(learning_rate=2e-2)).result()
        sampler = trainer.save_weights_and_get_sampling_client().result()
        result = sampler.sample(types.ModelInput.from_ints(PROMPT), 2, params).result()
        policy = merged(server, trainer.model_id)
        for seq in result.sequences:
            np.testing.assert_allclose(seq.logprobs, recomputed(policy, PROMPT, seq.tokens),
                                       atol=1e-4)  # fmt: skip
    engine = server.service.engines.slots[next(iter(server.service.served))].engine
    whole = sum(p.numel() * p.element_size() for p in policy.parameters())
    assert engine.metrics()["vllm/sync_bytes"] >= whole  # the merged model, not an adapter


def test_the_command_line_launches_a_vllm_server_and_stops_it(tmp_path):
    """`ardea serve --tinker --engine vllm` with rollout.vllm.* overrides: the first sample
    launches a server; an inflight client samples the weights of the latest inflight save;
    SIGTERM stops the server with the command."""
    port, base = free_port(), write_model_dir(tmp_path / "base")
    command = [str(Path(sys.executable).parent / "ardea"), "serve", str(base), "--tinker",
               "--engine", "vllm", f"rollout.vllm.python={PYTHON}", "rollout.vllm.timeout_s=120",
               "--name", "tiny", "--port", str(port), "--state-dir", str(tmp_path / "state")]  # fmt: skip
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "TINKER_TELEMETRY": "0"})  # fmt: skip
    try:
        for _ in range(600):
            try:
                httpx.get(f"http://127.0.0.1:{port}/api/v1/healthz").raise_for_status()
                break
            except httpx.TransportError:
                assert process.poll() is None, (tmp_path / "serve.log").read_text()
                time.sleep(0.2)
        url = f"http://127.0.0.1:{port}"
        with tinker.ServiceClient(base_url=url, api_key="tml-test") as service:
            trainer = service.create_lora_training_client(base_model="tiny", rank=RANK,
                                                          train_unembed=False).result()  # fmt: skip
            sampler = trainer.save_weights_and_get_sampling_client(kind="inflight").result()
            params = types.SamplingParams(max_tokens=5, seed=1)
            prompt = types.ModelInput.from_ints(PROMPT)
            first = sampler.sample(prompt, 2, params).result()
            trainer.forward_backward(sft_data(), "cross_entropy").result()
            trainer.optim_step(types.AdamParams(learning_rate=5e-2)).result()
            trainer.save_weights_and_get_sampling_client(kind="inflight").result()
            later = sampler.sample(prompt, 2, params).result()  # the first client, new weights
            assert [s.logprobs for s in later.sequences] != [s.logprobs for s in first.sequences]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, (tmp_path / "serve.log").read_text()
    launched = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert launched.stdout == "", "the launched vLLM server outlived the command"
    assert list((tmp_path / "state" / "engines").glob("*/server.log"))

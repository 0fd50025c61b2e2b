"""The SDK's inflight sampling clients (``save_weights_and_get_sampling_client(kind=
"inflight")``) against the in-process server: every inflight client of a training model
samples the weights of its latest inflight save, older clients included, while a snapshot
keeps its own; the log-probs are those of the weights saved last."""

import numpy as np
import pytest
import tinker
import torch
from tinker import types

from ardea.service.tinker_server import TinkerServer
from ardea.service.tinker_wire import WireError
from tests.tiny_models import small_model

RANK = 4


@pytest.fixture(scope="module")
def running(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("inflight")
    small_model(tokenizer, seed=3, max_position_embeddings=128).save_pretrained(root / "tiny")
    tokenizer.save_pretrained(root / "tiny")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINKER_TELEMETRY", "0")
        with TinkerServer({"tiny": root / "tiny"}, state_dir=root / "state") as server:
            with tinker.ServiceClient(base_url=server.url, api_key="tml-test") as service:
                yield server, service


def step(trainer, tokenizer):
    ids = tokenizer.encode("12+30=42", add_special_tokens=False)
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})  # fmt: skip
    trainer.forward_backward([datum], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=5e-2)).result()


def scored(model, prompt, tokens):
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
    return logp.gather(-1, ids[0, 1:, None])[len(prompt) - 1 :, 0].numpy()


def test_inflight_clients_follow_the_latest_save_and_snapshots_do_not(running, tokenizer):
    server, service = running
    trainer = service.create_lora_training_client(base_model="tiny", rank=RANK, seed=1).result()
    prompt_ids = tokenizer.encode("12+3", add_special_tokens=False)
    prompt = types.ModelInput.from_ints(prompt_ids)
    params = types.SamplingParams(max_tokens=6, seed=4)
    first = trainer.save_weights_and_get_sampling_client(kind="inflight").result()
    snapshot = trainer.save_weights_and_get_sampling_client().result()
    before = first.compute_logprobs(prompt).result()
    assert snapshot.compute_logprobs(prompt).result() == before

    step(trainer, tokenizer)
    second = trainer.save_weights_and_get_sampling_client(kind="inflight").result()
    now = server.service.model(trainer.model_id)[1].merged_copy()
    old_client = first.sample(prompt, 3, params).result()
    new_client = second.sample(prompt, 3, params).result()
    for a, b in zip(old_client.sequences, new_client.sequences):
        assert a.tokens == b.tokens and a.logprobs == b.logprobs
        np.testing.assert_allclose(a.logprobs, scored(now, prompt_ids, a.tokens), atol=1e-5)
    latest = first.compute_logprobs(prompt).result()
    assert latest == second.compute_logprobs(prompt).result() and latest != before
    assert snapshot.compute_logprobs(prompt).result() == before  # a snapshot keeps its weights


def test_an_inflight_save_is_in_memory_only(running):
    service = running[0].service
    created = service.create_model({"session_id": "inflight", "model_seq_id": 0,
                                    "base_model": "tiny", "lora_config": {"rank": 2}})  # fmt: skip
    service.futures.get(created["request_id"]).result(60)
    body = {"model_id": "inflight:train:0", "seq_id": 1, "path": "x", "kind": "inflight"}
    with pytest.raises(WireError, match="an inflight save_weights_for_sampler takes no path"):
        service.save_for_sampler(body)
    with pytest.raises(WireError, match="kind='both'"):
        service.save_for_sampler({**body, "seq_id": 2, "kind": "both"})

"""The Tinker server in the precision asked (ardea's model.dtype and model.compute_dtype):
parameters in bfloat16, or float32 parameters computing under bfloat16 autocast; both
train (the loss falls) and sample, and the base's parameters keep their dtype."""

import math

import pytest
import tinker
import torch
from tinker import types

from ardea.service.tinker_server import TinkerServer
from tests.tiny_models import small_model


@pytest.mark.parametrize(("dtype", "compute"), [("bfloat16", "bfloat16"), ("float32", "bfloat16")])
def test_the_server_trains_and_samples_in_the_precision_asked(dtype, compute, tmp_path, tokenizer,
                                                              monkeypatch):  # fmt: skip
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    small_model(tokenizer, seed=3, max_position_embeddings=128).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    ids = tokenizer.encode("12+30=42", add_special_tokens=False)
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})  # fmt: skip
    with TinkerServer({"tiny": tmp_path / "tiny"}, state_dir=tmp_path / "state", dtype=dtype,
                      compute_dtype=compute) as server:  # fmt: skip
        with tinker.ServiceClient(base_url=server.url, api_key="tml-test") as service:
            trainer = service.create_lora_training_client(base_model="tiny", rank=4).result()
            losses = []
            for _ in range(3):
                out = trainer.forward_backward([datum], "cross_entropy").result()
                trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
                losses.append(out.metrics["loss:sum"])
            sampler = trainer.save_weights_and_get_sampling_client().result()
            prompt = types.ModelInput.from_ints(ids[:4])
            result = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=4, seed=0)).result()
            scored = sampler.compute_logprobs(prompt).result()
        model = server.service.model(trainer.model_id)[1]
    assert losses[0] > losses[1] > losses[2]
    assert all(len(s.tokens) == 4 and all(map(math.isfinite, s.logprobs)) for s in result.sequences)
    assert all(math.isfinite(x) for x in scored[1:])
    base = {p.dtype for p in model.policy.parameters() if not p.requires_grad}
    assert base == {getattr(torch, dtype)}  # (peft keeps the adapters in float32)
    assert model.precision.compute == torch.bfloat16

"""The weight transports of the vLLM engine (``rollout.vllm.weight_transport``): the names
the config accepts are the ones defined, and each asks its server to load what the trainer
wrote (the servers' side is tests/vllm_engine's: a real reload over both transports)."""

from __future__ import annotations

import base64
import os

import torch
from safetensors.torch import load

from ardea.config.vllm import WEIGHT_TRANSPORTS
from ardea.rollout.engines.vllm.extension import FOLDER
from ardea.rollout.engines.vllm.transports import TRANSPORTS, weight_transport


def test_the_configs_choices_are_the_defined_transports():
    assert tuple(TRANSPORTS) == WEIGHT_TRANSPORTS


def test_each_transport_reloads_what_was_written(tmp_path):
    tensors = {"embed_tokens.weight": torch.arange(6.0).reshape(3, 2)}
    file = weight_transport("file", tmp_path)
    size = file.write(tensors)
    route, body = file.reload()
    assert route == "/collective_rpc" and body["method"] == "reload_weights"
    assert body["kwargs"] == {"weights_path": str(tmp_path.resolve())}
    # safetensors: an 8-byte header length, the JSON header, then the tensors' bytes: the
    # embedding's 6 float32 values and the tied head written out beside it (the same values)
    written = (tmp_path / "model.safetensors").read_bytes()
    assert size == len(written) and written.endswith(torch.arange(6.0).numpy().tobytes())
    assert file.server_setup() == ([], {})

    http = weight_transport("http", tmp_path)
    route, body = http.reload()
    assert route == "/collective_rpc" and body["method"] == "ardea_load_weights"
    sent = load(base64.b64decode(body["kwargs"]["data"]))
    assert torch.equal(sent["embed_tokens.weight"], tensors["embed_tokens.weight"])
    # the tied head written out: vLLM keeps its old head when the file lacks it
    assert torch.equal(sent["lm_head.weight"], tensors["embed_tokens.weight"])
    flags, env = http.server_setup()
    assert flags == ["--worker-extension-cls", "ardea_weights.WeightUpload"]
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(FOLDER)

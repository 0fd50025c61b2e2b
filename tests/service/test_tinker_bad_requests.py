"""The Tinker server under bad input, as an attacker and a careless client would send it.

Every request of the corpus is a 4xx whose message names the field or limit, no 500; the
state directory and a sentinel directory beside it are byte-for-byte as they were (paths,
sizes, modification times); and the server answers a good request after each. Then the
faults that used to wedge a model, blow up memory or corrupt weights, through the real SDK.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
import torch
import zstandard
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

from ardea.agent.http_guard import ServerLimits
from ardea.errors import ArdeaError
from ardea.service.tinker_server import TinkerServer, tinker_limits
from ardea.service.tinker_store import Store
from tests.tiny_models import small_model

CONTEXT = 128
MODEL = "corpus:train:0"  # the corpus's own model, created over raw HTTP
SEQ = itertools.count(1)  # its seq_ids, taken in the order the cases run


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """``state/`` (the server's) and ``outside/``: a sentinel no request may touch."""
    root = tmp_path_factory.mktemp("sandbox")
    victim = root / "outside" / "weights" / "x"
    victim.mkdir(parents=True)
    (victim / "COMPLETE").write_text("{}")
    (root / "outside" / "run.json").write_text(json.dumps({"base_model": "secret"}))
    return root


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("tinker-base") / "tiny"
    small_model(tokenizer, seed=3, max_position_embeddings=CONTEXT).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(base_dir, sandbox):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINKER_TELEMETRY", "0")
        with TinkerServer({"tiny": base_dir}, state_dir=sandbox / "state") as running:
            created = post(running, "create_model", {"session_id": "corpus", "model_seq_id": 0,
                                                     "base_model": "tiny", "lora_config": {"rank": 2}})  # fmt: skip
            running.service.futures.get(created.json()["request_id"]).result(60)
            post(running, "create_sampling_session", {"session_id": "corpus", "base_model": "tiny",
                                                      "sampling_session_seq_id": 0})  # fmt: skip
            yield running


@pytest.fixture(scope="module")
def service(server):
    with tinker.ServiceClient(base_url=server.url, api_key="tml-test") as client:
        yield client


def post(server, route, body, headers=None):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **(headers or {})}
    return httpx.post(f"{server.url}/api/v1/{route}", content=content, headers=headers, timeout=30)


def tensor(values, dtype=pb.DTYPE_FLOAT32, np_type=np.float32):
    array = np.asarray(values, np_type)
    return pb.Tensor(dense=array.tobytes(), dtype=dtype, shape=list(array.shape))


def fwd(tokens, inputs=None, model_id=MODEL, loss_fn="cross_entropy", seq=None) -> bytes:
    """A raw forward_backward body: one datum of ``tokens`` (targets: the same ids)."""
    datum = pb.Datum()
    datum.model_input.add().encoded_text.tokens = np.asarray(tokens, np.int32).tobytes()
    inputs = inputs if inputs is not None else {
        "target_tokens": tensor(tokens, pb.DTYPE_INT64, np.int64),
        "weights": tensor([1.0] * len(tokens))}  # fmt: skip
    for name, value in inputs.items():
        datum.loss_fn_inputs[name].CopyFrom(value)
    seq = next(SEQ) if seq is None else seq
    return pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq, loss_fn=loss_fn,
                                     data=[datum]).SerializeToString()  # fmt: skip


def csr_out_of_range():
    csr = pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[2, 3])
    csr.sparse_csr.values = np.asarray([1.0], np.float32).tobytes()
    csr.sparse_csr.crow_indices = np.asarray([0, 1, 1], np.int64).tobytes()
    csr.sparse_csr.col_indices = np.asarray([7], np.int64).tobytes()
    return fwd([5, 6], {"target_tokens": tensor([5, 6], pb.DTYPE_INT64, np.int64), "weights": csr})


def overflowing(name: str) -> bytes:
    """An optim_step whose ``name`` is 1e400: valid JSON that parses to infinity."""
    return json.dumps(adam(**{name: "OVER"})).replace('"OVER"', "1e400").encode()


def adam(**params):
    return {"model_id": MODEL, "seq_id": next(SEQ), "adam_params": params}


def model(**fields):
    return {"session_id": "s9", "model_seq_id": 1, "base_model": "tiny", **fields}


def sample(**fields):
    return {"sampling_session_id": "corpus:sample:0", "num_samples": 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 6]}]},
            "sampling_params": {"max_tokens": 2}, **fields}  # fmt: skip


PROTO = {"content-type": "application/x-protobuf"}
ZSTD = {**PROTO, "content-encoding": "zstd"}
UP = "%2E%2E/%2E%2E/%2E%2E/outside"
# (what, method, route, body (a function: bodies take seq_ids when the case runs), headers,
#  status, a phrase of the message)
CORPUS = [
    # names are never paths
    ("delete ../../../outside, encoded", "DELETE", f"training_runs/{MODEL}/checkpoints/weights/{UP}",
     None, {}, 400, "checkpoint_id"),
    ("delete ..%2F..%2F..%2Foutside", "DELETE",
     f"training_runs/{MODEL}/checkpoints/weights/..%2F..%2F..%2Foutside", None, {}, 400, "checkpoint_id"),
    ("delete with a model id that climbs", "DELETE", "training_runs/..%2F..%2Foutside/checkpoints/weights/x",
     None, {}, 404, "Not Found"),
    ("delete a file that is not a save", "DELETE", f"training_runs/{MODEL}/checkpoints/weights/missing",
     None, {}, 400, "no checkpoint"),
    ("training run that climbs", "GET", "training_runs/..%2F..%2Foutside", None, {}, 404, "Not Found"),
    ("list checkpoints that climb", "GET", "training_runs/..%2Foutside/checkpoints", None, {}, 404,
     "Not Found"),
    ("a training run named .. (dots kept)", "GET", "training_runs/%2E%2E", None, {}, 400, "not a model id"),
    ("sampler id that climbs", "GET", "samplers/..%2F..%2Foutside", None, {}, 404, "Not Found"),
    ("a sampler named ..", "GET", "samplers/%2E%2E", None, {}, 400, "not a sampling session"),
    ("session_id an absolute path", "POST", "create_model", lambda: model(session_id="/tmp/x"), {}, 400,
     "create_model.session_id"),
    ("session_id ../../escape", "POST", "create_model", lambda: model(session_id="../../escape"), {}, 400,
     "create_model.session_id"),
    ("model_seq_id a path", "POST", "create_model", lambda: model(model_seq_id="0/../../../../tmp/y"), {},
     400, "create_model.model_seq_id"),
    ("weights_info tinker://../weights/x", "POST", "weights_info",
     lambda: {"tinker_path": "tinker://../weights/x"}, {}, 400, "tinker_path"),
    ("weights_info into the sentinel", "POST", "weights_info",
     lambda: {"tinker_path": "tinker://../../outside/weights/x"}, {}, 400, "tinker_path"),
    ("save_state('..', overwrite)", "POST", "save_weights",
     lambda: {"model_id": MODEL, "seq_id": next(SEQ), "path": "..", "overwrite": True}, {}, 400, "path"),
    ("save_state('.', overwrite)", "POST", "save_weights",
     lambda: {"model_id": MODEL, "seq_id": next(SEQ), "path": ".", "overwrite": True}, {}, 400, "path"),
    ("save_state into the sentinel", "POST", "save_weights",
     lambda: {"model_id": MODEL, "seq_id": next(SEQ), "path": "../../../outside/y"}, {}, 400, "path"),
    ("sampler weights named ../x", "POST", "save_weights_for_sampler",
     lambda: {"model_id": MODEL, "seq_id": next(SEQ), "path": "../x"}, {}, 400, "path"),
    ("load a state that climbs", "POST", "load_weights",
     lambda: {"model_id": MODEL, "seq_id": next(SEQ), "path": f"tinker://{MODEL}/weights/../../outside"},
     {}, 400, "path"),
    ("sample from weights that climb", "POST", "create_sampling_session",
     lambda: {"session_id": "corpus", "sampling_session_seq_id": 9,
              "model_path": "tinker://../weights/x"}, {}, 400, "model_path"),
    # a web page cannot drive it
    ("text/plain post", "POST", "create_session", lambda: {}, {"content-type": "text/plain"}, 415,
     "takes Content-Type"),
    ("a page's Origin", "POST", "create_session", lambda: {}, {"origin": "http://evil.example"}, 403,
     "web page origin"),
    ("a rebinding page's Host", "POST", "create_session", lambda: {}, {"host": "evil.example"}, 403,
     "is not this server's"),
    ("forward_backward as JSON", "POST", "forward_backward", lambda: {}, {}, 415, "application/x-protobuf"),
    # wrong JSON types and values
    ("base_model a list", "POST", "create_model", lambda: model(base_model=[1]), {}, 400, "base_model"),
    ("unknown base_model", "POST", "create_model", lambda: model(base_model="nope"), {}, 400, "base_model"),
    ("lora_config a string", "POST", "create_model", lambda: model(lora_config="x"), {}, 400, "lora_config"),
    ("rank a string", "POST", "create_model", lambda: model(lora_config={"rank": "2"}), {}, 400, "rank"),
    ("rank 2.7", "POST", "create_model", lambda: model(lora_config={"rank": 2.7}), {}, 400, "rank"),
    ("rank 100000", "POST", "create_model", lambda: model(lora_config={"rank": 100000}), {}, 400,
     "lora_config.rank=100000"),
    ("rank 0", "POST", "create_model", lambda: model(lora_config={"rank": 0}), {}, 400, "rank"),
    ("seed a string", "POST", "create_model", lambda: model(lora_config={"seed": "x"}), {}, 400, "seed"),
    ("train_mlp a string", "POST", "create_model", lambda: model(lora_config={"train_mlp": "yes"}), {},
     400, "train_mlp"),
    ("100 KB of user_metadata", "POST", "create_model", lambda: model(user_metadata={"x": "y" * 10**5}),
     {}, 400, "max_metadata_bytes"),
    ("user_metadata a list", "POST", "create_model", lambda: model(user_metadata=[1]), {}, 400,
     "user_metadata"),
    ("optimizer sgd", "POST", "create_model", lambda: model(optimizer_config={"type": "sgd"}), {}, 400,
     "optimizer_config.type"),
    ("seq_id a string", "POST", "optim_step", lambda: {"model_id": MODEL, "seq_id": "a"}, {}, 400,
     "optim_step.seq_id"),
    ("model_id a path", "POST", "optim_step", lambda: {"model_id": "../x", "seq_id": 1}, {}, 400,
     "optim_step.model_id"),
    ("learning_rate Infinity", "POST", "optim_step",
     lambda: f'{{"model_id": "{MODEL}", "seq_id": 999999, "adam_params": '
             '{"learning_rate": Infinity}}'.encode(), {}, 400, "Infinity is not JSON"),
    ("learning_rate 1e400 (inf)", "POST", "optim_step", lambda: overflowing("learning_rate"), {}, 400,
     "learning_rate"),
    ("learning_rate 1e30", "POST", "optim_step", lambda: adam(learning_rate=1e30), {}, 400,
     "learning_rate"),
    ("eps 0", "POST", "optim_step", lambda: adam(eps=0), {}, 400, "adam_params.eps"),
    ("weight_decay inf", "POST", "optim_step", lambda: overflowing("weight_decay"), {}, 400,
     "weight_decay"),
    ("beta1 1", "POST", "optim_step", lambda: adam(beta1=1.0), {}, 400, "beta1"),
    ("adam_params a list", "POST", "optim_step",
     lambda: {"model_id": MODEL, "seq_id": next(SEQ), "adam_params": [1]}, {}, 400, "adam_params"),
    ("save path a number", "POST", "save_weights",
     lambda: {"model_id": MODEL, "seq_id": next(SEQ), "path": 5}, {}, 400, "path=5"),
    ("request_id a number", "POST", "retrieve_future", lambda: {"request_id": 5}, {}, 400, "request_id"),
    ("100,000 [", "POST", "get_info", lambda: b"[" * 100_000, {}, 400, "nested too deeply"),
    ("a body that is not JSON", "POST", "get_info", lambda: b"{", {}, 400, "not JSON"),
    ("num_samples a string", "POST", "asample", lambda: sample(num_samples="3"), {}, 400, "num_samples"),
    ("num_samples 10**6", "POST", "asample", lambda: sample(num_samples=10**6), {}, 400,
     "num_samples"),
    ("num_samples × max_tokens too many", "POST", "asample",
     lambda: sample(num_samples=4000, sampling_params={"max_tokens": 100}), {}, 400, "max_sample_tokens"),
    ("prompt without chunks", "POST", "asample", lambda: sample(prompt={"chunks": []}), {}, 400, "chunks"),
    ("a token a string", "POST", "asample",
     lambda: sample(prompt={"chunks": [{"tokens": [1, "a"]}]}), {}, 400, "tokens"),
    ("prompt log-probs of an out-of-vocabulary token", "POST", "asample",
     lambda: sample(prompt={"chunks": [{"tokens": [5, 10**6]}]}, prompt_logprobs=True), {}, 400,
     "token id 1000000"),
    ("prompt log-probs of a negative token", "POST", "asample",
     lambda: sample(prompt={"chunks": [{"tokens": [-1, 5]}]}, prompt_logprobs=True), {}, 400, "token id -1"),
    ("prompt log-probs of an empty prompt", "POST", "asample",
     lambda: sample(prompt={"chunks": [{"tokens": []}]}, prompt_logprobs=True), {}, 400, "0 tokens"),
    ("max_tokens 2.5", "POST", "asample", lambda: sample(sampling_params={"max_tokens": 2.5}), {}, 400,
     "max_tokens"),
    ("temperature a string", "POST", "asample", lambda: sample(sampling_params={"temperature": "hot"}),
     {}, 400, "temperature"),
    ("top_p 0", "POST", "asample", lambda: sample(sampling_params={"top_p": 0}), {}, 400, "top_p"),
    ("stop a list of lists", "POST", "asample", lambda: sample(sampling_params={"stop": [[1]]}), {}, 400,
     "stop"),
    ("an unknown sampling session", "POST", "asample", lambda: sample(sampling_session_id="x:sample:5"),
     {}, 400, "unknown sampling_session_id"),
    # forward_backward's protobuf
    ("garbage zstd", "POST", "forward_backward", lambda: b"nonsense", ZSTD, 400, "does not decompress"),
    ("128 KB of zstd inflating to 256 MiB", "POST", "forward_backward",
     lambda: zstandard.ZstdCompressor().compress(b"\0" * 2**28), ZSTD, 413, "decompresses past"),
    ("not a protobuf", "POST", "forward_backward", lambda: b"\xff\xff\xff", PROTO, 400,
     "not a ForwardBackwardRequest"),
    ("truncated tensor bytes", "POST", "forward_backward", lambda: fwd([5, 6], {
        "target_tokens": tensor([5, 6], pb.DTYPE_INT64, np.int64),
        "weights": pb.Tensor(dense=b"\0" * 7, dtype=pb.DTYPE_FLOAT32, shape=[2])}), PROTO, 400,
     "7 bytes"),
    ("CSR column out of range", "POST", "forward_backward", csr_out_of_range, PROTO, 400, "CSR"),
    ("float target_tokens", "POST", "forward_backward", lambda: fwd([5, 6], {
        "target_tokens": tensor([5.0, 6.0]), "weights": tensor([1.0, 1.0])}), PROTO, 400,
     "not integer token ids"),
    ("a 4,096-token datum against a 128-token context", "POST", "forward_backward",
     lambda: fwd([5] * 4096), PROTO, 400, "4096 tokens"),
    ("an out-of-vocabulary input token", "POST", "forward_backward", lambda: fwd([5, 10**6]), PROTO, 400,
     "token ids outside"),
    ("a model id that climbs", "POST", "forward_backward", lambda: fwd([5, 6], model_id="../../x", seq=1),
     PROTO, 400, "not a model id"),
    ("an unserved loss", "POST", "forward_backward", lambda: fwd([5, 6], loss_fn="stable_reinforce"),
     PROTO, 400, "stable_reinforce"),
]  # fmt: skip


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}  # fmt: skip


@pytest.mark.parametrize("what,method,route,body,headers,status,phrase", CORPUS,
                         ids=[c[0] for c in CORPUS])  # fmt: skip
def test_bad_request_is_a_4xx_naming_it_and_changes_nothing(server, sandbox, what, method, route,
                                                           body, headers, status, phrase):  # fmt: skip
    before = snapshot(sandbox)
    started = time.monotonic()
    if method == "POST":
        content = body()
        reply = post(server, route, content, headers)
    else:
        reply = httpx.request(method, f"{server.url}/api/v1/{route}", headers=headers, timeout=30)
    assert reply.status_code == status, reply.text
    assert phrase in reply.json()["detail"], reply.json()
    assert len(reply.text) < 1000, "a value echoed in full"
    assert time.monotonic() - started < 10
    assert snapshot(sandbox) == before, "a refused request changed files"
    info = post(server, "get_info", {"model_id": MODEL})
    assert info.status_code == 200 and info.json()["lora_rank"] == 2


def test_the_corpus_left_the_model_untouched_and_ordered(server):
    """The refused training requests took their seq_ids: the next one runs at once, and the
    model has no gradient and its initial weights (a fresh rank-2 LoRA: B = 0)."""
    _, trained = server.service.models[MODEL]
    assert all(p.grad is None for p in trained.parameters)
    assert all(torch.count_nonzero(p) == 0 for n, p in trained.policy.named_parameters()
               if "lora_B" in n)  # fmt: skip
    reply = post(server, "optim_step", adam(learning_rate=1e-3))
    assert reply.status_code == 200
    assert (
        server.service.futures.get(reply.json()["request_id"]).result(30)["metrics"]["grad_norm"]
        == 0
    )


def test_a_refused_call_between_two_good_ones_does_not_wedge_the_model(service, tokenizer):
    trainer = service.create_lora_training_client(base_model="tiny", rank=2, seed=1).result()
    ids = tokenizer.encode("12+30=42", add_special_tokens=False)
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})  # fmt: skip
    assert trainer.save_state("a").result(timeout=30).path.endswith("/weights/a")
    with pytest.raises(tinker.BadRequestError, match="exists already"):
        trainer.save_state("a").result()  # refused at once: its place is still taken
    loss = trainer.forward_backward([datum], "cross_entropy")
    step = trainer.optim_step(types.AdamParams(learning_rate=1e-3))
    assert loss.result(timeout=30).metrics["loss:sum"] > 0
    assert step.result(timeout=30).metrics["grad_norm"] > 0
    sampler = service.create_sampling_client(base_model="tiny")
    scored = sampler.sample(types.ModelInput.from_ints(ids[:2]), 1, types.SamplingParams(max_tokens=2),
                            include_prompt_logprobs=True).result(timeout=30)  # fmt: skip
    assert len(scored.prompt_logprobs) == 2 and scored.prompt_logprobs[0] is None


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_million_samples_are_refused_at_once_and_memory_stays_flat(service):
    sampler = service.create_sampling_client(base_model="tiny")
    prompt = types.ModelInput.from_ints([5, 6])
    sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result(timeout=30)  # warm
    before, started = rss_bytes(), time.monotonic()
    with pytest.raises(tinker.BadRequestError, match="num_samples"):
        sampler.sample(prompt, 10**6, types.SamplingParams(max_tokens=2)).result(timeout=30)
    assert time.monotonic() - started < 1.0
    assert rss_bytes() - before < 50 * 2**20  # the 10**6 rows once took 23.7 GB


def test_a_failing_datum_leaves_no_gradient_from_the_others(service, server, tokenizer):
    """17 data (two micro-batches of 16 and 1); the last one's behaviour log-prob of -1e30
    makes its importance ratio infinite: the call fails and the first 16's gradient, already
    accumulated, is taken back, so the next step has no gradient to apply."""
    trainer = service.create_lora_training_client(base_model="tiny", rank=2, seed=2).result()
    ids = tokenizer.encode("7+8=15", add_special_tokens=False)
    n = len(ids) - 1

    def datum(q):
        return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={
            "target_tokens": ids[1:], "logprobs": [q] * n, "advantages": [1.0] * n})  # fmt: skip

    with pytest.raises(tinker.RequestFailedError, match=r"data\[16:17\] is not finite"):
        trainer.forward_backward(
            [datum(-1.0)] * 16 + [datum(-1e30)], "importance_sampling"
        ).result()
    metrics = trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result().metrics
    assert metrics["grad_norm"] == 0.0 and metrics["loss"] == 0.0


def test_two_samples_without_seq_id_are_two_requests(server):
    body = {k: v for k, v in sample().items() if k != "seq_id"}
    first, second = (post(server, "asample", body).json() for _ in range(2))
    assert first["request_id"] != second["request_id"]


def test_a_state_changed_on_disk_is_refused_at_load(service, server):
    trainer = service.create_lora_training_client(base_model="tiny", rank=2, seed=3).result()
    path = trainer.save_state("sealed").result().path
    directory = server.service.store.existing(path)[0]
    adapter = server.service.store.directory(directory) / "adapter" / "adapter_model.safetensors"
    data = bytearray(adapter.read_bytes())
    data[-4:] = np.asarray([np.nan], np.float32).tobytes()  # the last weight NaN, same size
    adapter.write_bytes(bytes(data))
    with pytest.raises(tinker.BadRequestError, match="does not match its SHA-256"):
        service.create_training_client_from_state(path).result()


def test_a_crashed_save_is_cleaned_at_start_and_nothing_else(tmp_path):
    leftover = tmp_path / "s1:train:0" / "weights" / ".tmp_a_4242"
    leftover.mkdir(parents=True)
    (leftover / "policy").mkdir()
    kept = tmp_path / "s1:train:0" / "notes" / ".tmp_mine"
    kept.mkdir(parents=True)
    Store(tmp_path)
    assert not leftover.exists() and kept.exists()


def test_the_sdk_with_a_key_and_without(base_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    limits = tinker_limits(api_key="tml-secret")
    with TinkerServer({"tiny": base_dir}, state_dir=tmp_path, limits=limits) as keyed:
        with tinker.ServiceClient(base_url=keyed.url, api_key="tml-secret") as client:
            trainer = client.create_lora_training_client(base_model="tiny", rank=2).result()
            assert trainer.get_info().lora_rank == 2
        with pytest.raises(tinker.AuthenticationError, match="wrong API key"):
            wrong = tinker.ServiceClient(base_url=keyed.url, api_key="tml-wrong", max_retries=0)
            wrong.get_server_capabilities()
    with pytest.raises(ArdeaError, match="give it an API key"):
        TinkerServer({"tiny": base_dir}, state_dir=tmp_path, host="0.0.0.0",
                     limits=ServerLimits())  # fmt: skip

"""The vLLM engine's routing over a pool and its LoRA adapter syncs, against stub servers.

The servers here are stubs: small HTTP servers (``http.server`` on 127.0.0.1) that answer
exactly the endpoints ``rollout.engine=vllm`` calls on servers the user started
(``rollout.vllm.urls``): the start-up checks (``/server_info``, ``/v1/models``), weight
reloads (``/collective_rpc``, ``/reset_prefix_cache``), ``/v1/load_lora_adapter`` and
streamed ``/v1/completions`` in the shape :mod:`ardea.rollout.engines.vllm.requests` parses (token
ids, log-probs, finish reason), and record every request (path, JSON body) per server. The
faults these tests catch are in ardea's routing and in the requests ardea sends, not in
vLLM, so a stub that records them is enough and the tests run on a CPU in seconds; the
real-server tests in tests/vllm_engine cover vLLM itself (a separate environment and a
minute of start-up).

- every request of one affinity key (an episode's row id) goes to one server, even when
  another is less loaded; a request without a key goes to the least loaded server; the keys
  are forgotten at a weight update;
- a LoRA policy's adapter is written anew and reloaded on every server at every weight
  update, and generations name the adapter's model.
"""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as load_safetensors

from ardea.model import build_char_tokenizer, build_tiny_model
from ardea.model.lora import apply_lora
from ardea.rollout import EngineSpec, Request, SamplingParams, make_engine
from ardea.rollout.engines.vllm.weights import LORA_NAME

TOKENIZER = build_char_tokenizer(model_max_length=256)
SIZE = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
MAX_MODEL_LEN = 256
WAIT_S = 10.0  # the longest any event here is waited for (a hang fails, it does not stall)
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=3, seed=7)
#: what the start-up checks read (ardea.rollout.engines.vllm.server.check_servers)
SERVER_INFO = {"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"}}}
MODELS = {"object": "list", "data": [{"id": "ardea", "max_model_len": MAX_MODEL_LEN}]}


class Gates:
    """Completions the stubs hold open until released, by prompt (shared by a pool's
    stubs: which server a request reaches is what the tests find out)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrived: dict[tuple[int, ...], threading.Event] = {}
        self._release: dict[tuple[int, ...], threading.Event] = {}

    def hold(self, prompt: list[int]) -> None:
        with self._lock:
            self._arrived[tuple(prompt)] = threading.Event()
            self._release[tuple(prompt)] = threading.Event()

    def wait_arrived(self, prompt: list[int]) -> None:
        """Returns once a stub streams the first token of ``prompt``'s held completion."""
        assert self._arrived[tuple(prompt)].wait(WAIT_S), f"{prompt} never reached a server"

    def release(self, prompt: list[int]) -> None:
        self._release[tuple(prompt)].set()

    def release_all(self) -> None:
        with self._lock:
            for event in self._release.values():
                event.set()

    def held(self, prompt: list[int]) -> tuple[threading.Event, threading.Event] | None:
        with self._lock:
            key = tuple(prompt)
            return (self._arrived[key], self._release[key]) if key in self._release else None


class StubServer:
    """One stub vLLM server (module docstring); ``requests``: ``(path, body)`` in arrival
    order, the body None for a GET; a ``/v1/load_lora_adapter`` body also gets
    ``"adapter_file"``: the bytes of the adapter file at ``lora_path`` when it arrived."""

    def __init__(self, gates: Gates) -> None:
        self.gates = gates
        self.requests: list[tuple[str, dict | None]] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                stub._get(self)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                stub._post(self, body)

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self._thread = threading.Thread(target=self.http.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()

    # ------------------------------------------------------------------ records
    def record(self, path: str, body: dict | None) -> None:
        with self._lock:
            self.requests.append((path, body))

    def bodies(self, path: str, since: int = 0) -> list[dict]:
        """The bodies of the requests to ``path`` from the ``since``-th request on."""
        with self._lock:
            return [b for p, b in self.requests[since:] if p == path]

    def prompts(self) -> list[list[int]]:
        return [b["prompt"] for b in self.bodies("/v1/completions")]

    # ------------------------------------------------------------------ answers
    def _get(self, handler) -> None:
        path = handler.path.split("?")[0]
        self.record(path, None)
        if path == "/server_info":
            self._json(handler, SERVER_INFO)
        elif path == "/v1/models":
            self._json(handler, MODELS)
        else:
            handler.send_error(404)

    def _post(self, handler, body: dict) -> None:
        path = handler.path.split("?")[0]
        if path == "/v1/load_lora_adapter":
            adapter = Path(body["lora_path"]) / "adapter_model.safetensors"
            body = {**body, "adapter_file": adapter.read_bytes()}
        self.record(path, body)
        if path in ("/collective_rpc", "/reset_prefix_cache"):
            self._json(handler, {})
        elif path == "/v1/load_lora_adapter":  # vLLM answers in text
            self._send(handler, b"Success: LoRA adapter loaded", "text/plain")
        elif path == "/v1/completions" and body.get("stream"):
            self._stream(handler, body)
        else:
            handler.send_error(404)

    def _json(self, handler, data) -> None:
        self._send(handler, json.dumps(data).encode(), "application/json")

    def _send(self, handler, data: bytes, kind: str) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _stream(self, handler, body: dict) -> None:
        """``max_tokens`` tokens, one event each, the last with finish reason "length"
        (HTTP/1.0: the stream ends when the connection closes); a held prompt's completion
        waits after its first token until the test releases it."""
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        held = self.gates.held(body["prompt"])
        count = body["max_tokens"]
        for i in range(count):
            event = {"choices": [{"index": 0, "text": "a", "token_ids": [40 + i],
                                  "logprobs": {"token_logprobs": [-0.5]},
                                  "finish_reason": "length" if i == count - 1 else None}]}  # fmt: skip
            handler.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            handler.wfile.flush()
            if i == 0 and held is not None:
                arrived, release = held
                arrived.set()
                release.wait(WAIT_S)
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()


@pytest.fixture
def pool():
    """Two stub servers sharing one set of gates; stopped (held requests released) after."""
    gates = Gates()
    servers = [StubServer(gates), StubServer(gates)]
    yield gates, servers
    gates.release_all()
    for server in servers:
        server.close()


def engine_on(servers, module, work_dir):
    """The vllm engine on the stubs, as a run builds it with ``rollout.vllm.urls`` (no probe:
    a stub's log-probs are not the policy's)."""
    options = {"urls": [s.url for s in servers], "timeout_s": WAIT_S, "sync_tolerance": 0.0}
    spec = EngineSpec.of(module, TOKENIZER, options=options, work_dir=work_dir)
    return make_engine("vllm", spec, module=module)


def served_on(servers, prompt: list[int]) -> list[int]:
    """The indices of the servers that received a completion of ``prompt``."""
    return [i for i, s in enumerate(servers) if prompt in s.prompts()]


def test_an_episode_stays_on_its_server_when_another_is_less_loaded(pool, tmp_path):
    """Two episodes (affinity keys 1 and 2, their row ids) interleaved on two stubs, one stub
    kept busy by a held request each time a later turn is sent, so that "the key's server"
    and "the least loaded server" disagree: each turn goes to its episode's server, a request
    without a key to the least loaded, and after a weight update (the keys forgotten) a
    turn is placed anew by load. Catches a pool that ignores the affinity key (always the
    least loaded server: the turns would move to the idle server) and one that keeps keys
    across a weight update."""
    gates, servers = pool
    engine = engine_on(servers, build_tiny_model(TOKENIZER, **SIZE), tmp_path)
    try:

        def turn(prompt: list[int], row: int, *, hold: bool = False):
            if hold:
                gates.hold(prompt)
            handle = engine.submit(Request(prompt, PARAMS, row_id=row))
            if hold:
                gates.wait_arrived(prompt)
                return handle
            return handle.result(timeout=WAIT_S)

        # episode 1's first turn: both idle, the lowest index; held, server 0 stays busy
        one_a = [5, 6, 7]
        held_one = turn(one_a, 1, hold=True)
        assert served_on(servers, one_a) == [0]
        two_a = [8, 9]  # episode 2's first turn: server 1 has fewer in flight
        turn(two_a, 2)
        assert served_on(servers, two_a) == [1]
        # episode 1's next turn: its server 0 is busy, server 1 idle; it stays on 0
        one_b = [5, 6, 7, 40, 41, 42, 10]
        assert turn(one_b, 1).token_ids == [40, 41, 42]
        assert served_on(servers, one_b) == [0], "episode 1 left its server for the idle one"
        keyless = [11, 12]  # no key: the least loaded server
        engine.generate([keyless], PARAMS)
        assert served_on(servers, keyless) == [1]

        # episode 3 holds server 1, episode 1's first turn ends: now server 0 is idle
        three_a = [13]
        held_three = turn(three_a, 3, hold=True)
        assert served_on(servers, three_a) == [1]
        gates.release(one_a)
        assert held_one.result(timeout=WAIT_S).token_ids == [40, 41, 42]
        two_b = [8, 9, 40, 41, 42, 14]  # episode 2 stays on the busy server 1
        turn(two_b, 2)
        assert served_on(servers, two_b) == [1], "episode 2 left its server for the idle one"
        two_c = [*two_b, 40, 41, 42, 15]  # a batch call naming its row: the same key
        engine.generate([two_c], SamplingParams(temperature=1.0, max_new_tokens=3, row_ids=[2]))
        assert served_on(servers, two_c) == [1]
        keyless_2 = [16, 17]
        engine.generate([keyless_2], PARAMS)
        assert served_on(servers, keyless_2) == [0]
        gates.release(three_a)
        held_three.result(timeout=WAIT_S)

        # a weight update forgets the keys: episode 2's next turn is placed by load (both
        # idle: server 0), and episode 1's, with server 0 then busy, on server 1
        engine.update_weights(build_tiny_model(TOKENIZER, **SIZE, seed=1).state_dict(), 1)
        two_d = [*two_c, 40, 41, 42, 18]
        held_two = turn(two_d, 2, hold=True)
        assert served_on(servers, two_d) == [0], "episode 2 kept its server across an update"
        one_c = [*one_b, 40, 41, 42, 19]
        turn(one_c, 1)
        assert served_on(servers, one_c) == [1], "episode 1 kept its server across an update"
        gates.release(two_d)
        held_two.result(timeout=WAIT_S)
    finally:
        gates.release_all()
        engine.close()


def test_a_lora_policy_reloads_its_new_adapter_on_every_server_at_each_update(pool, tmp_path):
    """A LoRA policy on two stubs: ``update_weights`` with new adapter weights writes the
    adapter into its directory and every server then gets a ``/v1/load_lora_adapter``
    request naming the adapter (in place) and that directory, which holds the new weights
    when the request arrives; generations on both servers name the adapter's model.
    Catches an update that skips the adapter reload (the servers would keep sampling from
    the previous adapter while the trainer labels the tokens with the new version), one
    that leaves the old adapter file, and generations that name the base model."""
    gates, servers = pool
    policy = apply_lora(
        build_tiny_model(TOKENIZER, **SIZE),
        r=4,
        alpha=16,
        dropout=0.0,
        target_modules=["q_proj", "v_proj"],
    )
    engine = engine_on(servers, policy, tmp_path)
    try:
        for index, server in enumerate(servers):  # at start: the base weights, then the adapter
            loads = [
                p for p, _ in server.requests if p in ("/collective_rpc", "/v1/load_lora_adapter")
            ]
            assert loads == ["/collective_rpc", "/v1/load_lora_adapter"], f"server {index}: {loads}"
        marks = [len(s.requests) for s in servers]

        new = {k: v.clone() for k, v in policy.state_dict().items()}
        lora_b = sorted(k for k in new if ".lora_B." in k)
        assert lora_b and all(not new[k].any() for k in lora_b)  # peft starts B at zero
        for i, name in enumerate(lora_b):
            new[name] = torch.full_like(new[name], 0.25 + i)
        engine.update_weights(new, 1)

        adapter_dir = str((tmp_path / "adapter").resolve())
        for index, (server, mark) in enumerate(zip(servers, marks)):
            loads = server.bodies("/v1/load_lora_adapter", since=mark)
            assert len(loads) == 1, f"server {index} did not reload the adapter at the update"
            load = loads[0]
            assert (load["lora_name"], load["lora_path"], load["load_inplace"]) == (
                LORA_NAME, adapter_dir, True,
            )  # fmt: skip
            written = load_safetensors(load["adapter_file"])
            for i, name in enumerate(lora_b):
                saved = name.replace(".lora_B.default.weight", ".lora_B.weight")
                assert torch.equal(written[saved], torch.full_like(written[saved], 0.25 + i)), (
                    f"server {index} was sent an adapter directory without the new {saved}"
                )
            assert server.bodies("/collective_rpc", since=mark) == []  # the base stays

        # generations after the update, one on each server (the first held on server 0)
        first, second = [5, 6], [7, 8]
        gates.hold(first)
        handle = engine.submit(Request(first, PARAMS, row_id=0))
        gates.wait_arrived(first)
        engine.generate([second], PARAMS)
        gates.release(first)
        handle.result(timeout=WAIT_S)
        assert [served_on(servers, p) for p in (first, second)] == [[0], [1]]
        for server in servers:
            assert {b["model"] for b in server.bodies("/v1/completions")} == {LORA_NAME}
    finally:
        gates.release_all()
        engine.close()

"""``rollout.engine=vllm``: generation on vLLM OpenAI-compatible servers.

Token ids in, token ids and behaviour log-probs out, over HTTP (``POST /v1/completions``
with ``prompt`` as token ids, ``logprobs: 0``, ``return_token_ids`` and ``stream``): one
streamed request per row, each on a thread of its own (:mod:`ardea.rollout.engines.vllm.requests`:
``submit``, ``abort``; ``generate`` submits a batch's rows and waits), vLLM batching them
continuously. Several servers
(``rollout.vllm.urls``, or ``rollout.vllm.servers`` launched) are a pool
(:mod:`ardea.rollout.engines.vllm.pool`): requests spread by load, every call of one episode on one
server, a server that dies taken out and its requests run elsewhere with the same seed.
Sampling maps one to one: temperature (0 = greedy), top-p, top-k, max and
min new tokens, stop ids (the model's eos ids always stop), stop strings, and the seed: a
seeded call gives each row the seed ``hash(seed, row id)``, so a rollout split over calls
or processes samples what one call would (``SamplingParams.row_ids``); a request resumed
after ``k`` tokens uses ``hash(seed, row id, k)`` (vLLM's random stream restarts with each
request, so a resumed request does not sample what an uninterrupted one would).

Behaviour log-probs must describe the distribution sampled from: a server is accepted only
in ``--logprobs-mode processed_logprobs`` (after temperature and top-k/top-p, as ardea's
in-process engine records them), checked at connect on ``/server_info``.

Weights (:meth:`VLLMEngine.update_weights`): a state dict is written as one safetensors
file into ``<run>/vllm/weights`` (:mod:`ardea.rollout.engines.vllm.weights`), then every server
reloads it (``/collective_rpc reload_weights``) and drops its prefix cache; the new version
is published only when every server has confirmed. A LoRA policy syncs its adapter alone,
which the servers load with vLLM's runtime LoRA API (same module). With ``rollout.vllm.sync_tolerance`` > 0
the servers' log-probs of a fixed greedy probe completion are then compared with the live
policy's own (``vllm/sync_logprob_error``): above the tolerance the run fails.

Every request has a timeout (``rollout.vllm.timeout_s``): a server that stalls or dies is
taken out of the pool; when none is left the call fails with a :class:`VLLMServerError`
naming every server. A launched server that died is restarted on the current weights
(``rollout.vllm.max_restarts``).

Under torchrun every rank has an engine on the same servers and sends its share of each
rollout: rank 0's leads (starts them, loads the weights), the others follow
(:mod:`ardea.rollout.engines.vllm.followers`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import torch

from ardea.config.vllm import VLLMConfig
from ardea.errors import ConfigError
from ardea.rollout.checks import is_peft, request_input
from ardea.rollout.engine import (
    Completion,
    EngineSpec,
    GenerationEngine,
    Request,
    RequestHandle,
    SamplingParams,
    Weights,
    check_next_version,
    check_prompts,
    load_weights,
    register_engine,
)
from ardea.rollout.engines.vllm.followers import PeerSync, counts
from ardea.rollout.engines.vllm.launch import launch_servers
from ardea.rollout.engines.vllm.limits import NO_ROUTED_EXPERTS, sync_hint
from ardea.rollout.engines.vllm.pool import PoolServer, ServerPool, VLLMServerDown
from ardea.rollout.engines.vllm.requests import (
    Running,
    StreamedRequests,
    completion_body,
    stream_segment,
)
from ardea.rollout.engines.vllm.server import (
    VLLMServerError,
    check_servers,
    log_tail,
)
from ardea.rollout.engines.vllm.transports import weight_transport
from ardea.rollout.engines.vllm.weights import (
    LORA_NAME,
    AdapterSync,
    adopt,
    checkpoint_layout,
    probe_gap,
    write_model_dir,
)

PROBE_TOKENS = 8  # greedy tokens of the weight-sync probe
LOG_SETTLE_S = 1.0  # a server that failed a generation logs why after it answers: wait this long
# how many request timeouts a rank waits for the others at a weight load (a follower: for
# rank 0's reloads and probes; rank 0: for a follower's background worker to end its step)
WAIT_TIMEOUTS = 10


class VLLMEngine(GenerationEngine):
    """Generates on vLLM servers (module docstring).

    Args:
        spec: the model's config, tokenizer and stop ids; ``spec.options`` is
            ``rollout.vllm`` (:class:`ardea.config.vllm.VLLMConfig`'s fields: checked and
            defaulted by that class, whoever builds the engine) and
            ``spec.work_dir`` where weights and server logs go.
        module: the policy the engine generates for: its weights start the servers, it
            answers the sync probe, and :meth:`update_weights` loads the new weights into it
            (free when they are its own tensors, the trainer's live policy).
        version: the policy version of ``module``'s weights.
    """

    def __init__(self, spec: EngineSpec, *, module: torch.nn.Module | None, version: int = 0):
        if module is None:
            raise ValueError("the vllm engine needs the live policy module (its first weights)")
        if spec.work_dir is None:
            raise ValueError("the vllm engine needs spec.work_dir for its weights and logs")
        self.spec, self.module = spec, module
        self._stop_token_ids = tuple(spec.stop_token_ids)
        try:
            self.options = VLLMConfig(**spec.options)
        except TypeError as exc:  # an option VLLMConfig does not have
            raise ConfigError(f"rollout.vllm: {exc}") from None
        self.work_dir = Path(spec.work_dir)
        self.weights_dir = self.work_dir / "weights"
        self.transport = weight_transport(self.options.weight_transport, self.weights_dir)
        self.sync = PeerSync(
            spec.peers,
            start_wait_s=self.options.startup_timeout_s + 4 * self.options.timeout_s,
            load_wait_s=WAIT_TIMEOUTS * self.options.timeout_s,
        )
        self.shared = self.sync.shared  # the ranks of a job drive the servers together
        follows = not self.sync.leads
        lora = is_peft(module)
        transport = self.options.weight_transport
        self.adapter = (
            AdapterSync(module, self.work_dir, transport) if lora and not follows else None
        )
        self.model_name = LORA_NAME if lora else "ardea"
        self._version = version
        self._lock = threading.Lock()
        self._metrics: dict[str, float] = {}
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self.http = httpx.Client(timeout=self.options.timeout_s, limits=limits)
        try:
            servers = self._servers(follows)
            self.requests = StreamedRequests(self._segment, lambda: self._version, len(servers))
            self.pool = ServerPool(
                servers,
                request=self._request,
                max_restarts=self.options.max_restarts,
                started=self._started,
            )
            self._max_context = self._check_servers(servers)
            if not follows and not self.options.launch:  # servers the user started: the
                self._reload_all(full=True)  # policy's (base) weights
            if self.adapter is not None:
                self._reload_all()
        except BaseException as error:  # told to the followers, which wait for the servers
            if not follows:
                self.sync.started(None, error)
            raise
        if not follows:
            self.sync.started(self.urls)

    # ------------------------------------------------------------ interface
    def metrics(self) -> dict[str, float]:
        """The last sync's and the pool's (rank 0 of a job: every rank's requests)."""
        metrics = self._metrics | self.pool.metrics()
        return self.sync.totals(metrics) if self.sync.leads else metrics

    @property
    def urls(self) -> list[str]:
        """The servers' base URLs, in pool order (a restarted server has a new one)."""
        return [s.url for s in self.pool.servers]

    @property
    def in_flight(self) -> str:
        return self.requests.in_flight

    @in_flight.setter
    def in_flight(self, value: str) -> None:
        self.requests.in_flight = value

    def submit(self, request: Request) -> RequestHandle:
        """Stream ``request`` on the server of its row id (module docstring)."""
        ids, left = request_input(request)
        self._check([ids], left, request.params)
        return self.requests.submit(request, request.row_id)

    def abort(self, handles: Sequence[RequestHandle]) -> list[Completion]:
        return self.requests.abort(handles)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """``len(prompts) * params.n`` completions, prompt-major (module docstring)."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        self._check(prompts, params.max_new_tokens, params)
        rows = params.rows(len(prompts) * params.n)
        # a call that names its rows keeps each on one server (an episode's calls share one)
        named = params.row_ids is not None
        handles = [
            self.requests.submit(
                Request(list(prompts[i // params.n]), params, row), row if named else None
            )
            for i, row in enumerate(rows)
        ]
        return [h.result() for h in handles]

    def update_weights(self, weights: Weights, version: int) -> None:
        """Write ``weights`` (a state dict or a directory of safetensors) into the servers'
        weights directory, have every server reload them, then publish ``version`` (module
        docstring). A follower's (followers.py) gets ``{}`` and waits for rank 0's load."""
        with self._lock, self.requests.paused():
            check_next_version(version, self._version)
            if not self.sync.leads:
                self.sync.pause(version, counts(self.pool.metrics()))
                self.pool.follow(self.sync.wait_loaded(version))
            else:
                self._load(weights, version)
            self.pool.forget()
            self._version = version

    def _load(self, weights: Weights, version: int) -> None:
        """Every server loads ``weights`` (once every follower paused: followers.py)."""
        self.sync.wait_paused(version)
        try:
            tensors = load_weights(weights)
            adopt(self.module, tensors)
            if self.adapter is not None:  # the adapter alone; the servers keep the base
                self._metrics["vllm/sync_bytes"] = self.adapter.write(tensors)
            else:  # a directory is rewritten too: save_pretrained leaves a tied head out
                saved = checkpoint_layout(self.module, tensors)
                self._metrics["vllm/sync_bytes"] = self.transport.write(saved)
            self.pool.restart_dead()  # launched servers that died start on these weights
            self._reload_all()
            self._probe()
        except BaseException as error:  # told to the followers, which wait for the load
            self.sync.loaded(version, None, error)
            raise
        self.sync.loaded(version, [s.url if s.up else None for s in self.pool.servers])

    def close(self) -> None:
        self.requests.close()
        for server in self.pool.servers:
            if server.launched is not None:
                server.launched.stop()
        self.http.close()

    # ------------------------------------------------------------ requests
    def _check(self, prompts: list[list[int]], max_new_tokens: int, params=None) -> None:
        if params is not None and params.routed_experts:
            raise ValueError(NO_ROUTED_EXPERTS)
        vocab = int(self.spec.model_config.vocab_size)
        check_prompts(prompts, vocab_size=vocab, max_new_tokens=max_new_tokens,
                      max_positions=self._max_context)  # fmt: skip

    def _segment(self, run: Running, version: int) -> str | None:
        """Stream one segment of ``run`` on its server (:mod:`ardea.rollout.engines.vllm.requests`)."""
        request = run.request
        prompt = list(request.prompt_ids) + run.tokens
        body = completion_body(
            prompt, request.params, request.row_id, self.stop_token_ids, len(run.tokens),
            model=self.model_name,
        )  # fmt: skip
        return self.pool.stream(
            run.key,
            lambda url: stream_segment(
                self.http, url, body, run, version, lambda: self._log(url, settle=True)
            ),
        )

    def _request(self, url: str, path: str, body: dict[str, Any] | None, call: str) -> Any:
        try:
            if body is None:
                response = self.http.get(url + path)
            else:
                response = self.http.post(url + path, json=body)
        except httpx.TimeoutException:
            raise VLLMServerDown(
                f"the vLLM server {url} did not answer {call} ({path}) within "
                f"{self.http.timeout.read:.0f} s (rollout.vllm.timeout_s){self._log(url)}"
            ) from None
        except httpx.HTTPError as error:
            raise VLLMServerDown(
                f"the vLLM server {url} failed {call} ({path}): {error}{self._log(url)}"
            ) from None
        if response.status_code != 200:
            raise VLLMServerError(
                f"the vLLM server {url} answered {call} ({path}) with HTTP "
                f"{response.status_code}: {response.text[:500]}{self._log(url)}"
            )
        if not response.content or path == "/v1/load_lora_adapter":  # it answers in text
            return {}
        return response.json()

    def _log(self, url: str, *, settle: bool = False) -> str:
        """The end of the log of the launched server at ``url`` ('' for a user's); ``settle``:
        after a second, for a server that failed a generation and logs why after it answers."""
        pool = getattr(self, "pool", None)  # None while the servers start
        for server in pool.servers if pool is not None else ():
            if server.url == url and server.launched is not None:
                time.sleep(LOG_SETTLE_S if settle else 0.0)
                path = server.launched.log_path
                return f"; its log {path} ends:\n{log_tail(path)}"
        return ""

    # ------------------------------------------------------------- servers
    def _servers(self, follows: bool) -> list[PoolServer]:
        """The pool: rank 0's servers for a follower; else those started (``launch``) on
        the policy's weights, or the user's (``urls``)."""
        if follows:
            return [PoolServer(i, url) for i, url in enumerate(self.sync.servers())]
        self._write_model_dir()
        if self.options.launch:
            dtype = str(next(self.module.parameters()).dtype).removeprefix("torch.")
            return launch_servers(self.options, self.spec, self.transport, dtype=dtype,
                                  lora=self.adapter)  # fmt: skip
        return [PoolServer(i, u.rstrip("/")) for i, u in enumerate(self.options.urls)]

    def _started(self, server: PoolServer) -> None:
        """A server the pool (re)started: checked, and given a LoRA policy's adapter."""
        self._check_servers([server])
        if self.adapter is not None:
            self._request(server.url, "/v1/load_lora_adapter", self.adapter.load_body(),
                          "a LoRA adapter load")  # fmt: skip

    def _check_servers(self, servers: list[PoolServer]) -> int | None:
        """:func:`~ardea.rollout.engines.vllm.server.check_servers` on ``servers``' URLs."""
        return check_servers([s.url for s in servers], self._request)

    def _reload_all(self, *, full: bool = False) -> None:
        """Every live server loads the weights (``rollout.vllm.weight_transport``:
        :mod:`~ardea.rollout.engines.vllm.transports`), or a LoRA policy's adapter unless
        ``full``; one that does not answer is taken out (the call fails when none is left)."""
        call, hint = "a weight reload", self.transport.hint
        if self.adapter is not None:
            hint = (f"(a LoRA policy: start the server with --enable-lora --max-lora-rank "
                    f"{self.adapter.rank} and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)")  # fmt: skip
        if self.adapter is not None and not full:  # full: the weights file (a LoRA base)
            route, call, body = "/v1/load_lora_adapter", "a LoRA adapter load", self.adapter.load_body()  # fmt: skip
        else:
            route, body = self.transport.reload()
        for server in self.pool.live:
            try:
                self._request(server.url, route, body, call)
                self._request(server.url, "/reset_prefix_cache", {}, "a prefix-cache reset")
            except VLLMServerDown as error:
                self.pool.take_out(server, server.url, error)
            except VLLMServerError as error:
                if not hint:
                    raise
                raise VLLMServerError(f"{error}\n{hint}") from None
        self.pool.require_live()  # a restarted server starts on the file just written

    # ------------------------------------------------------------- weights
    def _write_model_dir(self) -> None:
        """The model directory servers start from (the frozen base of a LoRA policy, whose
        adapter then goes to its own directory)."""
        weights = self.module.state_dict() if self.adapter is None else self.adapter.base_weights()
        write_model_dir(self.weights_dir, self.spec, self.module, weights)
        if self.adapter is not None:
            self.adapter.write(self.module.state_dict())

    @torch.no_grad()
    def _probe(self) -> None:
        """The servers' greedy log-probs of a fixed prompt against the live policy's."""
        tolerance = self.options.sync_tolerance
        if tolerance <= 0:
            return
        prompt = list(self.spec.tokenizer("1+1=", add_special_tokens=False)["input_ids"])
        greedy = SamplingParams(temperature=0.0, max_new_tokens=PROBE_TOKENS)
        body = completion_body(prompt, greedy, 0, self.stop_token_ids, model=self.model_name)
        worst = 0.0
        for url in [server.url for server in self.pool.live]:
            reply = self._request(url, "/v1/completions", body, "the sync probe")
            worst = max(worst, probe_gap(self.module, prompt, reply["choices"][0]))
        self._metrics["vllm/sync_logprob_error"] = worst
        if worst > tolerance:
            raise VLLMServerError(
                f"after the weight reload the vLLM servers' log-probs of a probe completion "
                f"differ from the policy's by {worst:.2e} > rollout.vllm.sync_tolerance="
                f"{tolerance}: the servers did not load the trained weights"
                + sync_hint(self.module)
            )


@register_engine("vllm")
def vllm_engine(spec: EngineSpec, *, module=None, version: int = 0) -> VLLMEngine:
    """The engine on vLLM servers (module docstring)."""
    return VLLMEngine(spec, module=module, version=version)

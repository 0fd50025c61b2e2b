"""The generation-engine interface: sampling parameters, completions, and the engine contract.

An engine turns token-id prompts into completions carrying the behaviour log-prob of every
generated token and the policy version of the weights that produced them. Every engine (the
in-process one, one that drives a server) implements :class:`GenerationEngine` — generate,
``version``, ``max_context``, ``stop_token_ids``, ``update_weights`` (named tensors or a
directory of saved weights) and ``close`` — and nothing outside an engine reaches into it
(there is no ``engine.model``). An engine is built from an :class:`EngineSpec`, what a
remote engine also has (the model's config and directory, the tokenizer, the stop ids, the
precision); the in-process engine additionally takes the live module. Engines are registered
by name (``rollout.engine``, :func:`register_engine`), so callers never special-case one.
"""

from __future__ import annotations

import abc
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

from ardea.registry import Registry, callable_check
from ardea.rollout.checks import (  # noqa: F401 - part of the engine interface
    check_next_version,
    check_prompts,
    check_state_dict,
    load_weights,
)
from ardea.rollout.peers import EnginePeers
from ardea.rollout.sampling_params import SamplingParams, check_int

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class Completion:
    """One generated continuation of one prompt.

    ``token_ids`` includes the stop token when one was produced (``finish_reason == "stop"``;
    ``"abort"``: cut short by :meth:`GenerationEngine.abort`, the tokens so far);
    ``logprobs[i]`` is the behaviour log-prob of ``token_ids[i]`` (see the engine for how
    temperature and truncation enter). ``spans`` says which weights made which tokens:
    ``[(start, version), ...]``, starts increasing from 0, token ``i`` made by the version of
    the last span starting at or before ``i``; one span ``[(0, version)]`` unless a weight
    update came while the completion was being generated (it then went on under the new
    weights from the tokens so far). ``version`` is the first span's: the oldest weights the
    completion holds tokens of. ``seconds``: from its submission to its end, when the engine
    timed it (None otherwise; not compared). ``routed_experts`` (asked for by
    ``SamplingParams.routed_experts``, else None; not compared): ``(P + G, L, K)`` integer, the
    experts each of the ``L`` MoE layers routed every prompt and generated token to when the
    engine last ran it (-1 for a token it never ran: the last one).
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    version: int
    spans: list[tuple[int, int]] = field(default_factory=list)
    seconds: float | None = field(default=None, compare=False)
    routed_experts: torch.Tensor | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        self.spans = [(int(a), int(v)) for a, v in self.spans] or [(0, self.version)]
        starts = [a for a, _ in self.spans]
        if starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])):
            raise ValueError(f"spans must start at 0 with increasing starts, got {self.spans}")
        if self.spans[0][1] != self.version:
            raise ValueError(f"version {self.version} is not the first span's: {self.spans}")

    @property
    def token_versions(self) -> list[int]:
        """The policy version of each token (``len(token_ids)``), from ``spans``."""
        ends = [a for a, _ in self.spans[1:]] + [len(self.token_ids)]
        out: list[int] = []
        for (start, version), end in zip(self.spans, ends):
            out += [version] * max(0, min(end, len(self.token_ids)) - start)
        return out


@dataclass
class Request:
    """One completion for :meth:`GenerationEngine.submit`: ``prompt_ids``, the sampling
    ``params`` (``n`` and ``row_ids`` are ignored: one request is one row), the ``row_id``
    whose random numbers it samples with (as row ``row_id`` of a seeded call), and
    ``prefix``: a completion of this prompt cut short (an aborted one) to go on from; its
    tokens, log-probs and spans are kept, and the request samples position ``len(prefix)``
    on, up to ``params.max_new_tokens`` in all."""

    prompt_ids: list[int]
    params: SamplingParams
    row_id: int = 0
    prefix: Completion | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(self.params).__name__}")
        check_int("row_id", self.row_id, 0)
        if self.prefix is not None and len(self.prefix.token_ids) >= self.params.max_new_tokens:
            raise ValueError(
                f"the prefix already has {len(self.prefix.token_ids)} tokens, not fewer than "
                f"max_new_tokens={self.params.max_new_tokens}"
            )


class RequestHandle:
    """A submitted :class:`Request`: :meth:`done`, and :meth:`result` when it is.

    The event a waiting :meth:`result` blocks on is made only when one waits: a batch call's
    rows are polled, and thousands of events a call are garbage the collector must walk."""

    _lock = threading.Lock()  # guards the lazily made events and callbacks of every handle

    def __init__(self, request: Request) -> None:
        self.request = request
        self._done = False
        self._event: threading.Event | None = None
        self._callbacks: list[Callable[[RequestHandle], None]] = []
        self._completion: Completion | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, callback: Callable[[RequestHandle], None]) -> None:
        """Call ``callback(handle)`` once it is done: at once when it is, else in the thread
        that finishes it (keep it short: it runs between two decode steps)."""
        with self._lock:
            if not self._done:
                self._callbacks.append(callback)
                return
        callback(self)

    def result(self, timeout: float | None = None) -> Completion:
        """The completion (``finish_reason`` "abort" when it was aborted); waits up to
        ``timeout`` seconds (None: until done) and raises the request's error."""
        if not self._done:
            with self._lock:
                if not self._done and self._event is None:
                    self._event = threading.Event()
                event = self._event
            if event is not None and not event.wait(timeout):
                raise TimeoutError(f"the request was not done after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._completion  # type: ignore[return-value]

    def finish(self, completion: Completion | None, error: BaseException | None = None) -> None:
        """Set the outcome (the engine's side); a second call changes nothing."""
        with self._lock:
            if self._done:
                return
            self._completion, self._error, self._done = completion, error, True
            event, callbacks, self._callbacks = self._event, self._callbacks, []
        if event is not None:
            event.set()
        for callback in callbacks:
            callback(self)


Weights = Mapping[str, torch.Tensor] | str | os.PathLike
"""New weights for :meth:`GenerationEngine.update_weights`: a model state dict, or a
directory holding them as ``*.safetensors`` files (what ``save_pretrained`` writes)."""


@dataclass(frozen=True)
class EngineSpec:
    """What every engine is built from, in process or remote.

    ``model_config``: the model's Hugging Face config (architecture, vocabulary, context);
    ``tokenizer``; ``stop_token_ids``: the ids that end a completion (:func:`stop_token_ids`);
    ``model_dir``: a directory with the weights (None: the model was built in code);
    ``precision``: the :class:`ardea.model.Precision` forwards compute under (None: the
    parameters' dtype); ``options``: the engine's own settings (``rollout.<engine>``, e.g.
    ``rollout.vllm``, as a dict); ``work_dir``: where it may write (weights, server logs);
    ``peers``: under torchrun, the ranks that drive this engine's servers together
    (:mod:`ardea.rollout.peers`; None: this process alone, or an engine of its own on every
    rank).
    """

    model_config: Any
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    model_dir: str | None = None
    precision: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)
    work_dir: str | None = None
    peers: EnginePeers | None = None

    @classmethod
    def of(
        cls,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        model_dir=None,
        precision=None,
        options: Mapping[str, Any] | None = None,
        work_dir=None,
        peers: EnginePeers | None = None,
    ) -> EngineSpec:
        """The spec of a built ``model`` (its config and generation config's eos ids)."""
        stops = tuple(stop_token_ids(model, tokenizer))
        path = None if model_dir is None else str(model_dir)
        work = None if work_dir is None else str(work_dir)
        options = dict(options or {})
        return cls(model.config, tokenizer, stops, path, precision, options, work, peers)


class GenerationEngine(abc.ABC):
    """Token-id prompts + :class:`SamplingParams` → completions with behaviour log-probs.

    Two ways in: :meth:`generate`, a batch of prompts answered together, and requests
    (:meth:`submit` one :class:`Request`, its :class:`RequestHandle` done when it finishes,
    :meth:`abort` for the tokens so far), which an engine that serves them decodes
    continuously: a request joins the running ones at the next decode step and leaves when
    it ends. An engine owns its weights: :meth:`update_weights` is the only way new weights
    reach it, and it loads them and publishes ``version`` as one atomic step; requests
    running at that moment go on under the new weights from the tokens they have (their
    cache recomputed), so every token is labelled with the version that produced it
    (``Completion.spans``), or, with ``in_flight = "restart"``, drop their tokens and sample
    again from their prompts under the new weights.
    """

    in_flight: Literal["resume", "restart"] = "resume"
    #: the ranks of a torchrun job drive this engine's servers together (``spec.peers``):
    #: every rank must load the same sequence of versions (:mod:`ardea.rollout.worker`)
    shared: bool = False

    @abc.abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Return ``len(prompts) * params.n`` completions: prompt 0's n samples, then prompt 1's."""

    def submit(self, request: Request) -> RequestHandle:
        """Start ``request``; its handle is done when the completion ends (or is aborted)."""
        raise NotImplementedError(_batch_only(self))

    def submit_all(self, requests: Sequence[Request]) -> list[RequestHandle]:
        """Start ``requests`` together (an engine that batches them decodes them from the
        same step on); their handles, in order.

        An engine that answers whole batches only (no :meth:`submit`) generates them here,
        one :meth:`generate` call per distinct sampling options (each request's row of the
        call's random numbers, ``SamplingParams.row_ids``), and returns done handles.
        """
        if type(self).submit is not GenerationEngine.submit:
            return [self.submit(r) for r in requests]
        handles = [RequestHandle(r) for r in requests]
        groups: dict[str, list[RequestHandle]] = {}
        for h in handles:
            if h.request.prefix is not None:
                raise NotImplementedError(_batch_only(self))
            groups.setdefault(repr(h.request.params), []).append(h)
        for group in groups.values():
            rows = [h.request.row_id for h in group]
            params = replace(group[0].request.params, n=1, row_ids=rows)
            try:
                completions = self.generate([h.request.prompt_ids for h in group], params)
            except Exception as exc:  # noqa: BLE001 - the group's requests fail with it
                for h in group:
                    h.finish(None, exc)
                continue
            for h, completion in zip(group, completions, strict=True):
                h.finish(completion)
        return handles

    def wait(self, handles: Sequence[RequestHandle]) -> list[Completion]:
        """The completions of ``handles`` once all are done (raises the first one's error);
        an engine decoding in this process may decode in the calling thread meanwhile."""
        return [h.result() for h in handles]

    def abort(self, handles: Sequence[RequestHandle]) -> list[Completion]:
        """Stop the requests of ``handles``; per handle its completion: the finished one, or
        the tokens so far with ``finish_reason`` "abort" (which ``Request.prefix`` resumes)."""
        raise NotImplementedError(_batch_only(self))

    @abc.abstractmethod
    def update_weights(self, weights: Weights, version: int) -> None:
        """Load ``weights`` (a model state dict, or a directory of ``*.safetensors`` files
        with one) as policy ``version`` (> the current)."""

    # set by each engine: what the three properties below read
    _version: int = 0
    _max_context: int | None = None
    _stop_token_ids: tuple[int, ...] = ()

    @property
    def version(self) -> int:
        """Policy version of the weights the next ``generate`` call will use."""
        return self._version

    @property
    def max_context(self) -> int | None:
        """Most positions a prompt plus its completion may take (None: no limit known)."""
        return self._max_context

    @property
    def stop_token_ids(self) -> list[int]:
        """The ids that always end a completion (the model's end-of-sequence ids)."""
        return list(self._stop_token_ids)

    def close(self) -> None:  # noqa: B027 - an engine without resources has nothing to do
        """Release what the engine holds (a server, a process, memory); idempotent."""

    def metrics(self) -> dict[str, float]:
        """The engine's own metrics of its last weight update (e.g.
        ``vllm/sync_logprob_error``), logged with the step's; none by default."""
        return {}


def _batch_only(engine: GenerationEngine) -> str:
    return (
        f"the {type(engine).__name__} engine answers whole batches only (generate); it does "
        "not serve requests (submit / abort) or resume a prefix"
    )


EngineFactory = Callable[..., GenerationEngine]
ENGINES: Registry[EngineFactory] = Registry(
    "generation engine", "engines", field="rollout.engine", check=callable_check
)


def register_engine(
    name: str, *, per_process: bool = False
) -> Callable[[EngineFactory], EngineFactory]:
    """Decorator registering ``factory(spec: EngineSpec, *, module, version) -> engine`` as
    ``rollout.engine=<name>``. ``module`` is the live ``nn.Module`` an in-process engine
    generates with (None for engines that load ``spec.model_dir`` themselves); ``version``
    the policy version of the initial weights. Under torchrun every rank builds one and
    generates its share of each rollout. ``per_process``: each rank's engine holds its own
    weights (an engine in the process: :meth:`GenerationEngine.update_weights` gets this
    rank's own tensors, FSDP2 shards included); else the ranks share the engine's servers
    (``spec.peers``): rank 0's engine gets the whole weights and loads them, the others'
    get ``{}`` and wait for rank 0's load (:mod:`ardea.rollout.peers`)."""

    def register(factory: EngineFactory) -> EngineFactory:
        factory.per_process = per_process  # type: ignore[attr-defined]
        return ENGINES.register(name)(factory)

    return register


def per_process_engine(name: str) -> bool:
    """Whether every rank of a torchrun job runs engine ``name`` on weights of its own
    (:func:`register_engine`; else the ranks share its servers)."""
    return bool(getattr(engine_factory(name), "per_process", False))


def engine_factory(name: str) -> EngineFactory:
    """The engine factory ``name`` (registered, or a dotted path to your own); an unknown
    name lists the known ones."""
    return ENGINES.get(name)


def make_engine(
    name: str, spec: EngineSpec, *, module: torch.nn.Module | None = None, version: int = 0
) -> GenerationEngine:
    """The engine ``rollout.engine=<name>`` built from ``spec`` (and ``module``, for an
    engine that generates with a live module: it shares that module's weights)."""
    return engine_factory(name)(spec, module=module, version=version)


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a completion: the generation config's eos ids, else the tokenizer's."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = configured if isinstance(configured, list) else [configured]
    ids = [i for i in ids if i is not None] or [tokenizer.eos_token_id]
    return sorted(set(ids))

"""Sampling for the Tinker API: a sampler per set of sampler weights, on an engine.

A sampler decodes on an engine of the server's ``rollout.engine`` registry
(:mod:`tinker_slot`: an in-process engine of its own on the weights merged, or a turn on an
engine in other processes that the samplers of its base model share), so concurrent
``asample`` requests are decoded together; prompts are scored by a module of the same
weights in this process. ``sample`` maps the SDK's ``SamplingParams``:
``max_tokens`` (None: up to the model's context), ``temperature`` (0: greedy), ``top_k``
(-1: off), ``top_p``, ``seed`` (each of the ``num_samples`` rows gets its own random
numbers of that seed) and ``stop`` (None: the model's end-of-sequence tokens; strings or
token ids stop too, and the stop token or the tokens that complete a stop string are part
of the returned tokens, as the client's parsers expect). Every sampled token carries the
log-prob of the distribution it was drawn from (``temperature``, ``top_k``, ``top_p``).
``prompt_logprobs``: ``log p(x_t | x_<t)`` under the same weights, NaN at ``t = 0``.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from ardea.model import Precision
from ardea.model.logprobs import logprobs_from_logits
from ardea.rollout.engine import Completion, EngineSpec, Request, Weights, make_engine
from ardea.rollout.sampling_params import SamplingParams
from ardea.service.tinker_fields import MAX_INT32, Fields
from ardea.service.tinker_slot import Direct, Lease
from ardea.service.tinker_wire import WireError

MAX_ROWS = 64  # rows decoded together: bounds the engine's KV cache whatever is queued
MAX_STOPS = 16
_nothing = contextlib.nullcontext
UNSUPPORTED_SAMPLING = ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k",
                        "target_prompt_logprobs", "prompt_logprobs_last_n")  # fmt: skip


class Sampler:
    """One set of weights, decoded on an engine and scored in this process.

    ``module``: those weights as a frozen plain causal LM, or a callable that makes it when
    first needed; it scores prompts and, without a ``lease``, an engine of the sampler's own
    decodes on it (``make_engine(engine, ...)``, at most :data:`MAX_ROWS` rows together).
    ``lease``: a turn on an engine shared with other samplers
    (:class:`~ardea.service.tinker_slot.Lease`) instead. ``config``: the model's Hugging
    Face config (context, vocabulary; default the module's); ``precision``: what forwards
    compute under (None: the parameters' dtype)."""

    def __init__(self, module: torch.nn.Module | Callable[[], torch.nn.Module], tokenizer: Any,
                 *, engine: str = "in_process", precision: Precision | None = None,
                 lease: Lease | None = None, config: Any = None) -> None:  # fmt: skip
        self.tokenizer = tokenizer
        self.precision = precision
        made = isinstance(module, torch.nn.Module)
        self._scorer, self._module = (None, module) if made else (module, None)
        config = config if config is not None else self._module.config
        self.context = int(getattr(config, "max_position_embeddings", 2048))
        self.vocab = int(config.vocab_size)
        self.runner = lease
        if lease is None:
            spec = EngineSpec.of(self._module, tokenizer, precision=precision,
                                 options={"max_batch_size": MAX_ROWS})  # fmt: skip
            self.runner = Direct(make_engine(engine, spec, module=self._module))
        self._score_lock = threading.Lock()
        self._state = threading.Lock()
        self._in_flight = 0  # submitted calls not finished yet
        self._retired = False  # evicted: close once the calls in flight are done
        self._published = 0  # inflight weights published since the sampler was made

    @property
    def engine(self) -> Any:
        """The sampler's own engine (None on a shared one)."""
        return getattr(self.runner, "engine", None)

    def check_prompt(self, prompt: list[int]) -> None:
        if not prompt or len(prompt) >= self.context:
            raise WireError(f"asample.prompt has {len(prompt)} tokens: 1 to the model's context "
                            f"of {self.context} less one (room to sample)")  # fmt: skip
        if any(not 0 <= t < self.vocab for t in prompt):
            bad = next(t for t in prompt if not 0 <= t < self.vocab)
            raise WireError(f"asample.prompt has the token id {bad}, outside [0, {self.vocab})")

    def params(self, prompt: list[int], sampling: Fields, n: int) -> SamplingParams:
        """ardea's sampling parameters for the SDK's ``sampling_params``."""
        room = self.context - len(prompt)
        max_tokens = sampling.integer("max_tokens", None, low=1, high=MAX_INT32)
        if max_tokens is not None and max_tokens > room:
            raise WireError(
                f"sampling_params.max_tokens={max_tokens} does not fit: the "
                f"prompt has {len(prompt)} tokens of the model's {self.context}"
            )
        stop = sampling.body.get("stop")
        stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else None
        if stop is not None and (stops is None or len(stops) > MAX_STOPS
                                 or not all(map(self._is_stop, stops))):  # fmt: skip
            raise sampling.fail("stop", stop, f"a string, or a list of at most {MAX_STOPS} "
                                f"strings or token ids in [0, {self.vocab})")  # fmt: skip
        if stop is not None and not stops:
            raise WireError("sampling_params.stop=[] (no end-of-sequence stop) is not served")
        top_k = sampling.integer("top_k", -1, low=-1)
        try:
            return SamplingParams(
                temperature=sampling.number("temperature", 1.0, low=0.0, high=100.0),
                top_k=0 if top_k == -1 else top_k,
                top_p=sampling.number("top_p", 1.0, low=0.0, high=1.0, above=True),
                max_new_tokens=room if max_tokens is None else max_tokens,
                seed=sampling.integer("seed", None, high=2**63 - 1),
                stop=[s for s in stops or [] if isinstance(s, str)],
                stop_token_ids=[s for s in stops or [] if not isinstance(s, str)],
                n=n,
            )
        except ValueError as exc:
            raise WireError(f"sampling_params: {exc}") from exc

    def _is_stop(self, item: Any) -> bool:
        """A stop string (1 to 256 characters) or a token id of the vocabulary."""
        if isinstance(item, str):
            return 0 < len(item) <= 256
        return isinstance(item, int) and not isinstance(item, bool) and 0 <= item < self.vocab

    def submit(
        self, prompt: list[int], params: SamplingParams, done: Callable[[list[Completion]], None],
        fail: Callable[[BaseException], None],
    ) -> None:  # fmt: skip
        """Start ``params.n`` completions of ``prompt``; ``done(completions)`` (or ``fail``)
        is called from the engine's (or the slot's) thread when the last one ends."""
        self.check_prompt(prompt)
        with self._state:
            self._in_flight += 1

        def started(handles) -> None:
            left, lock = [len(handles)], threading.Lock()

            def finished(_handle) -> None:
                with lock:
                    left[0] -= 1
                    if left[0]:
                        return
                try:
                    done([h.result() for h in handles])
                except BaseException as exc:  # noqa: BLE001 - reported through the future
                    fail(exc)
                self._end()

            for handle in handles:
                handle.add_done_callback(finished)

        def failed(exc: BaseException) -> None:
            fail(exc)
            self._end()

        try:
            self.runner.start([Request(prompt, params, r) for r in range(params.n)],
                              started, failed)  # fmt: skip
        except BaseException:
            self._end()
            raise

    def _end(self) -> None:
        """A call finished: the last one of a retired sampler closes its runner (not on the
        engine's own thread, inside its step)."""
        with self._state:
            self._in_flight -= 1
            last = self._retired and self._in_flight == 0
        if last:
            threading.Thread(target=self.runner.close, daemon=True).start()

    def publish(self, weights: Weights | None = None) -> None:
        """Newer weights of an inflight set: ``weights`` for the sampler's own engine (which
        loads them into the module it scores with); without, the scorer is made again."""
        if weights is not None:
            with self._score_lock:
                self.runner.publish(weights)
            return
        with self._state:  # not the score lock: a scorer being made may wait on this thread
            self._published += 1
            self._module = None if self._scorer is not None else self._module

    @torch.no_grad()
    def prompt_logprobs(self, prompt: list[int]) -> list[float]:
        """``[NaN, log p(x_1 | x_0), ...]``: one value per prompt token."""
        with self._score_lock:
            with self._state:
                module, published = self._module, self._published
            if module is None:
                module = self._scorer()
                with self._state:  # kept unless newer weights came meanwhile
                    self._module = module if published == self._published else None
            ids = torch.tensor([prompt], dtype=torch.long, device=module.device)
            # autocast alone: an own engine decodes on this module meanwhile (no kernel switch)
            with self.precision.autocast() if self.precision else _nothing():
                logits = module(input_ids=ids).logits[:, :-1]
        scores = logprobs_from_logits(logits, ids[:, 1:])[0].cpu().tolist()
        return [math.nan, *scores]

    def retire(self) -> None:
        """Close the runner now, or when the calls in flight have finished."""
        with self._state:
            self._retired = True
            idle = self._in_flight == 0
        if idle:
            self.runner.close()

    def close(self) -> None:
        self.runner.close()


class SamplerCache:
    """The most recently used samplers by key; past ``size`` the least recently used one is
    retired (closed once its requests in flight are done)."""

    def __init__(self, size: int = 3) -> None:
        self.size = size
        self._samplers: OrderedDict[str, Sampler] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, build: Callable[[], Sampler]) -> Sampler:
        with self._lock:
            if key in self._samplers:
                self._samplers.move_to_end(key)
                return self._samplers[key]
        sampler = build()
        with self._lock:
            self._samplers[key] = sampler
            while len(self._samplers) > self.size:
                _, old = self._samplers.popitem(last=False)
                old.retire()  # an evicted sampler finishes what it was asked first
        return sampler

    def peek(self, key: str) -> Sampler | None:
        """The sampler of ``key`` when one is loaded (its use does not count)."""
        with self._lock:
            return self._samplers.get(key)

    def drop(self, key: str) -> None:
        """Forget the sampler of ``key`` (its weights were replaced), retiring it."""
        with self._lock:
            old = self._samplers.pop(key, None)
        if old is not None:
            old.retire()

    def close(self) -> None:
        with self._lock:
            for sampler in self._samplers.values():
                sampler.close()
            self._samplers.clear()

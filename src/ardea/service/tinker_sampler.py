"""Sampling for the Tinker API: one in-process engine per set of sampler weights.

A sampler holds a frozen plain model (the base with one snapshot of the adapters merged)
and ardea's :class:`~ardea.rollout.engines.inprocess.engine.InProcessEngine` on it, so concurrent
``asample`` requests are decoded together. ``sample`` maps the SDK's ``SamplingParams``:
``max_tokens`` (None: up to the model's context), ``temperature`` (0: greedy), ``top_k``
(-1: off), ``top_p``, ``seed`` (each of the ``num_samples`` rows gets its own random
numbers of that seed) and ``stop`` (None: the model's end-of-sequence tokens; strings or
token ids stop too, and the stop token or the tokens that complete a stop string are part
of the returned tokens, as the client's parsers expect). Every sampled token carries the
log-prob of the distribution it was drawn from (``temperature``, ``top_k``, ``top_p``).
``prompt_logprobs``: ``log p(x_t | x_<t)`` under the same weights, NaN at ``t = 0``.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from ardea.model.logprobs import logprobs_from_logits
from ardea.rollout.engine import Completion, Request, stop_token_ids
from ardea.rollout.engines.inprocess.engine import InProcessEngine
from ardea.rollout.sampling_params import SamplingParams
from ardea.service.tinker_fields import MAX_INT32, Fields
from ardea.service.tinker_wire import WireError

MAX_ROWS = 64  # rows decoded together: bounds the engine's KV cache whatever is queued
MAX_STOPS = 16
UNSUPPORTED_SAMPLING = ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k",
                        "target_prompt_logprobs", "prompt_logprobs_last_n")  # fmt: skip


class Sampler:
    """An engine on ``module`` (a frozen plain causal LM) and its prompt scorer."""

    def __init__(self, module: torch.nn.Module, tokenizer: Any) -> None:
        self.module = module
        self.tokenizer = tokenizer
        self.eos = stop_token_ids(module, tokenizer)
        self.context = int(getattr(module.config, "max_position_embeddings", 2048))
        self.vocab = int(module.get_input_embeddings().num_embeddings)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos[0]
        self.engine = InProcessEngine(module, pad_token_id=pad, eos_token_ids=self.eos,
                                      tokenizer=tokenizer, max_batch_size=MAX_ROWS)  # fmt: skip
        self._score_lock = threading.Lock()
        self._state = threading.Lock()
        self._in_flight = 0  # submitted calls not finished yet
        self._retired = False  # evicted: close once the calls in flight are done

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
        is called from the engine's thread when the last one ends."""
        self.check_prompt(prompt)
        with self._state:
            self._in_flight += 1
        handles = self.engine.submit_all([Request(prompt, params, r) for r in range(params.n)])
        left = [len(handles)]
        lock = threading.Lock()

        def finished(_handle) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            try:
                done([h.result() for h in handles])
            except BaseException as exc:  # noqa: BLE001 - reported through the future
                fail(exc)
            with self._state:
                self._in_flight -= 1
                last = self._retired and self._in_flight == 0
            if last:  # not on this thread: it is the engine's own, inside its step
                threading.Thread(target=self.engine.close, daemon=True).start()

        for handle in handles:
            handle.add_done_callback(finished)

    @torch.no_grad()
    def prompt_logprobs(self, prompt: list[int]) -> list[float]:
        """``[NaN, log p(x_1 | x_0), ...]``: one value per prompt token."""
        ids = torch.tensor([prompt], dtype=torch.long, device=self.module.device)
        with self._score_lock:
            logits = self.module(input_ids=ids).logits[:, :-1]
        scores = logprobs_from_logits(logits, ids[:, 1:])[0].cpu().tolist()
        return [math.nan, *scores]

    def retire(self) -> None:
        """Close the engine now, or when the calls in flight have finished."""
        with self._state:
            self._retired = True
            idle = self._in_flight == 0
        if idle:
            self.engine.close()

    def close(self) -> None:
        self.engine.close()


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

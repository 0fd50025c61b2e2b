"""The Tinker API's sampling side: sampling sessions and ``asample``.

A sampling session ``<session>:sample:<k>`` names a set of weights: a base model, sampler
weights saved under ``--state-dir`` (``tinker://...``), an in-memory snapshot of a training
model's adapters, or a training model's inflight weights (one set its inflight sessions
share, replaced by each inflight save). ``asample`` checks the whole request (prompt token
ids within the vocabulary, ``num_samples × max_tokens`` within :class:`TinkerLimits`) before
any work, then decodes on that weights' sampler (:mod:`tinker_sampler`, on the server's
engine: :mod:`tinker_engines`). A retried call (same session and ``seq_id``) gets the first
answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ardea.model.lora import POLICY_DIR
from ardea.service.tinker_fields import MAX_SEQ, SAMPLING_ID, Fields, TinkerLimits, shown
from ardea.service.tinker_futures import Futures
from ardea.service.tinker_sampler import UNSUPPORTED_SAMPLING, Sampler, SamplerCache
from ardea.service.tinker_store import Store
from ardea.service.tinker_wire import Busy, WireError, sample_response

MAX_PROMPT_CHUNKS = 4096
RETRIES_KEPT = 4096  # asample answers kept for retries (pruned to those whose results live)


def check_sampling_id(value: Any, at: str = "sampling_session_id") -> str:
    if not isinstance(value, str) or not SAMPLING_ID.fullmatch(value):
        raise WireError(f"{at}={shown(value)} is not a sampling session (<session>:sample:<n>)")
    return value


def prompt_tokens(prompt: Any) -> list[int]:
    """The token ids of ``asample``'s ``prompt`` (text chunks only)."""
    chunks = Fields(prompt, "asample.prompt").body.get("chunks")
    if not isinstance(chunks, list) or not 0 < len(chunks) <= MAX_PROMPT_CHUNKS:
        raise WireError(f"asample.prompt.chunks={shown(chunks)}: a list of 1 to "
                        f"{MAX_PROMPT_CHUNKS} chunks")  # fmt: skip
    tokens: list[int] = []
    for i, chunk in enumerate(chunks):
        fields = Fields(chunk, f"asample.prompt.chunks[{i}]")
        kind = fields.body.get("type", "encoded_text")
        if kind != "encoded_text":
            raise WireError(f"prompt chunk type {shown(kind)} is not served (text only)")
        ids = fields.body.get("tokens")
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids
        ):
            raise fields.fail("tokens", ids, "must be a list of integer token ids")
        tokens.extend(ids)
    return tokens


class Sampling:
    """Sampling sessions and their engines; ``weights_of(session_entry)`` builds a
    sampler's module (the service: it knows the models and the worker)."""

    def __init__(self, store: Store, futures: Futures, limits: TinkerLimits, samplers: int,
                 build: Callable[[tuple[str, str, Any]], Sampler]) -> None:  # fmt: skip
        self.store = store
        self.futures = futures
        self.limits = limits
        self.cache = SamplerCache(samplers)
        self.build = build
        self.sessions: dict[str, tuple[str, str, Any]] = {}  # id -> (base, key, source)
        self._asked: dict[tuple[str, int], dict[str, Any]] = {}
        self._in_flight = 0  # num_samples x max_tokens of the asample calls not finished
        self._lock = threading.Lock()

    def open(self, session: str, entry: tuple[str, str, Any]) -> None:
        with self._lock:
            self.sessions[session] = entry

    def replace(self, path: str, entry: tuple[str, str, Any]) -> None:
        """New sampler weights saved at ``path`` (perhaps over earlier ones of that name):
        a sampler built on the earlier ones is not used again."""
        self.open(path, entry)
        self.cache.drop(entry[1])

    def known(self, key: str) -> tuple[str, str, Any] | None:
        with self._lock:
            return self.sessions.get(key)

    def entry(self, session: Any) -> tuple[str, str, Any]:
        found = self.known(check_sampling_id(session))
        if found is None:
            raise WireError(f"unknown sampling_session_id {session!r}")
        return found

    def from_path(self, path: str, base_of: Callable[[str], str]) -> tuple[str, str, Any]:
        """The entry of saved sampler weights at ``path`` (``tinker://...``)."""
        known = self.known(path)
        if known is not None:
            return known
        parsed, directory = self.store.existing(path, "model_path")
        return base_of(parsed.model_id), path, ("directory", Path(directory) / POLICY_DIR)

    def sampler(self, session: str) -> Sampler:
        entry = self.entry(session)
        return self.cache.get(entry[1], lambda: self.build(entry))

    def asample(self, body: dict[str, Any]) -> dict[str, Any]:
        """Start ``num_samples`` completions of the prompt (with its log-probs when asked)."""
        fields = Fields(body, "asample")
        for key in UNSUPPORTED_SAMPLING:
            if body.get(key) not in (None, 0, False):
                raise WireError(f"{key} is not served by ardea's Tinker server")
        session = check_sampling_id(body.get("sampling_session_id"))
        seq = fields.integer("seq_id", None, high=MAX_SEQ)
        n = fields.integer("num_samples", 1, low=1, high=self.limits.max_sample_tokens)
        with_scores = fields.flag("prompt_logprobs", False)
        prompt = prompt_tokens(body.get("prompt"))
        if seq is not None:
            with self._lock:
                if (session, seq) in self._asked:
                    return self._asked[(session, seq)]
        sampler = self.sampler(session)
        sampler.check_prompt(prompt)
        params = sampler.params(prompt, fields.nested("sampling_params"), n)
        cost = self._reserve(n, params.max_new_tokens)
        request_id, future = self.futures.new()
        future.add_done_callback(lambda _f: self._release(cost))
        try:
            scores = sampler.prompt_logprobs(prompt) if with_scores else None

            def done(completions) -> None:
                rows = [(c.token_ids, c.logprobs, c.finish_reason == "stop") for c in completions]
                future.set_result(("proto", sample_response(rows, scores)))

            sampler.submit(prompt, params, done, future.set_exception)
        except BaseException as exc:
            future.set_exception(exc)  # releases the reservation
            raise
        answer = {"request_id": request_id,
                  "sample_sequence_ids": [f"{request_id}:{i}" for i in range(n)]}  # fmt: skip
        if seq is not None:
            self._remember((session, seq), answer)
        return answer

    def _reserve(self, n: int, max_tokens: int) -> int:
        cost = n * max_tokens
        if cost > self.limits.max_sample_tokens:
            raise WireError(f"num_samples × max_tokens = {n} × {max_tokens} = {cost}, over the "
                            f"server's max_sample_tokens of {self.limits.max_sample_tokens} "
                            "(ardea serve --tinker --max-sample-tokens)")  # fmt: skip
        with self._lock:
            if self._in_flight + cost > self.limits.max_sampling_in_flight:
                raise Busy(f"{self._in_flight} sampled tokens are in flight; {cost} more would "
                           "pass the server's max_sampling_in_flight of "
                           f"{self.limits.max_sampling_in_flight}: retry shortly")  # fmt: skip
            self._in_flight += cost
        return cost

    def _release(self, cost: int) -> None:
        with self._lock:
            self._in_flight -= cost

    def _remember(self, key: tuple[str, int], answer: dict[str, Any]) -> None:
        with self._lock:
            self._asked[key] = answer
            if len(self._asked) > RETRIES_KEPT:  # keep the retries of results still kept
                self._asked = {k: v for k, v in self._asked.items()
                               if self.futures.get(v["request_id"]) is not None}  # fmt: skip

    def close(self) -> None:
        self.cache.close()

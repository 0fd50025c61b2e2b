"""Scoring given token sequences on a vLLM server: a served model's log-probs of every next
token (vLLM's *prompt log-probs*), for a distillation teacher served by vLLM.

Each row is one ``POST /v1/completions`` with the row's token ids as the prompt,
``max_tokens: 1`` and ``prompt_logprobs: k``; the answer's ``prompt_logprobs[t]`` holds, for
``t >= 1``, the log-prob of token ``t`` after tokens ``0..t-1`` and the ``k`` most likely
tokens there with theirs (rank 1 first). Rows run concurrently (``max_concurrency``
requests at a time), vLLM batching them.

vLLM computes prompt log-probs from the model's logits as they are: temperature 1, no top-k
or top-p (its sampling processors do not run on prompt tokens, whatever
``--logprobs-mode``). A caller whose distribution differs must not use them; the trainer
refuses such a run (:mod:`ardea.trainer.scorers.teacher`).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from ardea.rollout.engines.vllm.server import VLLMServerError


@dataclass
class PromptScores:
    """One row's scores: ``logprobs[t]`` of token ``t + 1`` (``len(row) - 1`` entries) and,
    with ``k > 0``, ``top_ids[t]`` / ``top_logprobs[t]``: the ``k`` most likely tokens
    there, most likely first."""

    logprobs: list[float]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]


class VLLMPromptScorer:
    """Next-token log-probs of token sequences under the model a vLLM server serves.

    Args:
        url: the server's base URL (``http://host:port``).
        timeout_s: how long one row's request may take.
        max_concurrency: rows requested at once.
        model: the served model's name; None: the first the server lists.
    """

    def __init__(
        self, url: str, *, timeout_s: float, max_concurrency: int = 16, model: str | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(timeout=timeout_s)
        self.max_concurrency = max_concurrency
        self.model = model or self._first_model()

    def _first_model(self) -> str:
        try:
            listed = self.http.get(self.url + "/v1/models").json()["data"]
        except (httpx.HTTPError, KeyError, ValueError) as error:
            raise VLLMServerError(
                f"the vLLM server {self.url} did not list its models (/v1/models): {error}"
            ) from None
        if not listed:
            raise VLLMServerError(f"the vLLM server {self.url} serves no model")
        return str(listed[0]["id"])

    def score(self, rows: Sequence[Sequence[int]], top: int = 0) -> list[PromptScores]:
        """The scores of every row (each at least 2 tokens), in order."""
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(rows)))) as pool:
            return list(pool.map(lambda row: self._row(list(row), top), rows))

    def _row(self, ids: list[int], top: int) -> PromptScores:
        body = {
            "model": self.model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": top,
            "temperature": 1.0,
        }  # fmt: skip
        try:
            response = self.http.post(self.url + "/v1/completions", json=body)
        except httpx.HTTPError as error:
            raise VLLMServerError(
                f"the vLLM server {self.url} failed to score a row of {len(ids)} tokens: "
                f"{type(error).__name__}: {error}"
            ) from None
        if response.status_code != 200:
            raise VLLMServerError(
                f"the vLLM server {self.url} answered a prompt log-probs request with HTTP "
                f"{response.status_code}: {response.text[:500]}"
            )
        entries = response.json()["choices"][0].get("prompt_logprobs")
        if not entries or len(entries) != len(ids):
            raise VLLMServerError(
                f"the vLLM server {self.url} returned {len(entries or [])} prompt log-probs "
                f"for {len(ids)} tokens"
            )
        return _parse(ids, entries, top)


def _parse(ids: list[int], entries: list[Any], top: int) -> PromptScores:
    """``prompt_logprobs`` entries (``None`` for the first token, then ``{token id: {logprob,
    rank, ...}}``) as :class:`PromptScores`."""
    out = PromptScores([], [], [])
    for token, entry in zip(ids[1:], entries[1:]):
        scored = {int(key): value for key, value in entry.items()}
        out.logprobs.append(float(scored[token]["logprob"]))
        if top:
            ranked = sorted(  # the sampled token may tie one of the top k: k+1 entries
                (value["rank"], -value["logprob"], tid)
                for tid, value in scored.items()
                if value.get("rank") is not None and value["rank"] <= top
            )[:top]
            if len(ranked) < top:
                raise VLLMServerError(
                    f"a vLLM server returned {len(ranked)} top prompt log-probs, not {top}"
                )
            out.top_ids.append([tid for _, _, tid in ranked])
            out.top_logprobs.append([-float(neg) for _, neg, _ in ranked])
    return out

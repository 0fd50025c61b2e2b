"""The model work of the in-process engine's continuous batching: prefill rows that join,
and one decode step of a :class:`~ardea.rollout.engines.inprocess.decode_batch.DecodeBatch` (sample every
running row's next token, record it, end the rows that stop, feed the tokens back).

Notation: ``N`` rows, ``P`` the joining rows' padded input length, ``C`` cache columns,
``V`` vocabulary.

Prefill: the joining rows' inputs (prompt, then any resumed prefix) are left-padded to
``P``; ``position_ids = cumsum(attention_mask) − 1`` (0 on padding); identical inputs (the
n samples of one prompt) are computed once and their cache rows copied. Decode: each step
samples every running row from its last logits (:mod:`ardea.rollout.engines.inprocess.sampling`, with the
row's own random number for its position), stop tokens suppressed while the row has fewer
than ``min_new_tokens``; a row ends at a stop token, a stop string
(:mod:`ardea.rollout.engines.inprocess.stop_watch`) or ``max_new_tokens``; ended rows stay in the batch as
padding until half of it has ended (then they are dropped with a copy of the cache).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from ardea.model.routing_replay import record_routing
from ardea.rollout.engine import Request, SamplingParams
from ardea.rollout.engines.inprocess.decode_batch import DecodeBatch, Kind, Row
from ardea.rollout.engines.inprocess.fast_decode import FastDecoder
from ardea.rollout.engines.inprocess.kv_cache import new_cache, select_rows
from ardea.rollout.engines.inprocess.sampling import next_tokens
from ardea.rollout.engines.inprocess.stop_watch import StopWatch

COMPACT_MIN_ROWS = 8  # below this many rows, dropping ended rows is not worth a copy


def take_joining(
    waiting: list[Row],
    batches: dict[Kind, DecodeBatch],
    max_batch_size: int | None,
    merge_ok: bool | None,
) -> tuple[list[Row], list[Row]]:
    """The waiting rows that join now and those left waiting, in arrival order: within
    ``max_batch_size`` running rows per kind, and only into a kind with nothing running when
    caches cannot be merged (``merge_ok`` False)."""
    room: dict[Kind, int] = {}
    joining, left = [], []
    for row in waiting:
        kind = row.kind
        if kind not in room:
            batch = batches.get(kind)
            running = 0 if batch is None else batch.n_alive
            room[kind] = (
                0 if running and merge_ok is False else (max_batch_size or 1 << 62) - running
            )
        if room[kind] > 0:
            room[kind] -= 1
            joining.append(row)
        else:
            left.append(row)
    return joining, left


class Decoder:
    """Prefill and decode steps on ``model`` (module docstring).

    Args:
        model: the Hugging Face causal LM.
        fast: its compact decode step (:mod:`ardea.rollout.engines.inprocess.fast_decode`) or None.
        mask_dtype: dtype of prepared 4D additive masks, or None for 2D 0/1 masks.
        pad_token_id: fed for ended rows and used for left padding.
        cache_kwarg: the name under which the model's forward takes its cache.
        keep_last: whether the forward takes ``logits_to_keep``.
        tokenizer: for stop strings.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        fast: FastDecoder | None,
        mask_dtype: torch.dtype | None,
        pad_token_id: int,
        cache_kwarg: str,
        keep_last: bool,
        tokenizer: Any,
    ) -> None:
        self.model, self.fast, self.mask_dtype = model, fast, mask_dtype
        self.pad, self.cache_kwarg, self.keep_last = pad_token_id, cache_kwarg, keep_last
        self.tokenizer = tokenizer
        self.modules = list(model.modules())
        self.watches: dict[Kind, StopWatch] = {}
        self.stops: dict[Kind, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prefill(self, rows: list[Row], version: int) -> DecodeBatch:
        """The batch of ``rows`` after one forward of their inputs (module docstring)."""
        device = self.device
        first: dict[tuple[int, ...], int] = {}
        inverse = [first.setdefault(tuple(r.input_ids), len(first)) for r in rows]
        unique = [list(k) for k in first]
        lens = torch.tensor([len(r) for r in unique], device=device)  # (U,)
        width = int(lens.max())
        input_ids = torch.tensor([[self.pad] * (width - len(r)) + r for r in unique], device=device)
        keys = torch.arange(width, device=device) >= (width - lens)[:, None]  # (U, P)
        positions = (keys.long().cumsum(-1) - 1).clamp_min(0)
        if self.mask_dtype is None:
            mask = keys.long()
        else:
            causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
            allowed = causal & keys[:, None, None, :]  # (U, 1, P, P)
            mask = torch.zeros(allowed.shape, dtype=self.mask_dtype, device=device)
            mask = mask.masked_fill(~allowed, torch.finfo(self.mask_dtype).min)
        capacity = width + DecodeBatch.needed(rows)
        dtype = self.fast.compute_dtype if self.fast is not None else None
        cache = new_cache(self.model, capacity, dtype)
        record = rows[0].kind is not None and rows[0].kind.routed_experts
        logits, routes = self.forward(input_ids, mask, positions, cache, record=record)  # (U, V)
        if routes is not None:  # (U * P, L, K): each row's input, right-aligned
            routes = routes.view(len(unique), width, *routes.shape[1:]).cpu()
            for row, u in zip(rows, inverse):
                row.routes = routes[u, width - len(row.input_ids) :]
        full = torch.ones(len(unique), capacity, dtype=torch.bool, device=device)
        full[:, :width] = keys
        if len(unique) < len(rows):
            index = torch.tensor(inverse, device=device)
            select_rows(cache, index)
            logits, full, lens = logits[index], full[index], lens[index]
        return DecodeBatch(rows, logits, cache, width, full, lens, version)

    def step(self, batch: DecodeBatch, kind: Kind) -> list[tuple[Row, str]]:
        """One decode step of ``batch``; the rows that ended with it and their finish reason
        (their outputs folded into them)."""
        logits = batch.logits
        stop_ids, stop_cols = self._stops(kind, logits)
        if batch.has_min_new and len(kind.stop_ids):
            early = batch.count < batch.min_new  # (N,) rows whose stop tokens are suppressed
            logits = logits.masked_fill(early[:, None] & stop_cols, float("-inf"))
        tok, lp = next_tokens(
            logits, temperature=kind.temperature, top_k=kind.top_k, top_p=kind.top_p,
            uniforms=batch.step_uniforms(),
        )  # fmt: skip
        stopped = torch.isin(tok, stop_ids)  # (N,)
        if kind.stop:  # a stop string completed by this token ends its row
            watch = self.watches.setdefault(kind, StopWatch(self.tokenizer, kind.stop))
            hits = watch.step(batch.rows, tok.tolist(), batch.alive.tolist())
            # as vLLM: not before min_new_tokens
            hits = torch.tensor(hits, dtype=torch.bool, device=tok.device)
            stopped |= hits & (batch.count + 1 >= batch.min_new)
        ended = batch.record(tok, lp, stopped)
        done = []
        if ended:
            stops = stopped[ended].tolist()
            for i, (tokens, logprobs, routes), stop in zip(ended, batch.new_outputs(ended), stops):
                row = batch.rows[i]
                row.extend(tokens, logprobs, batch.version, routes)
                done.append((row, "stop" if stop else "length"))
        if kind.stop and done:
            self.watches[kind].forget([row for row, _ in done])
        if batch.n_alive == 0:
            return done
        if batch.n_alive * 2 <= len(batch.rows) and len(batch.rows) >= COMPACT_MIN_ROWS:
            keep = batch.running()
            tok = tok[keep]
            batch.select(keep)
        feed = torch.where(batch.alive, tok, self.pad)
        if self.fast is not None:
            batch.logits, routes = self.fast.step(
                feed, batch.positions, batch.step_keys(), batch.cache, record=kind.routed_experts
            )
        else:
            mask = batch.step_mask(self.mask_dtype)
            batch.logits, routes = self.forward(
                feed[:, None], mask, batch.positions[:, None], batch.cache,
                record=kind.routed_experts,
            )  # fmt: skip
        if routes is not None:
            batch.record_routes(routes)
        batch.advance()
        return done

    def _stops(self, kind: Kind, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``kind``'s stop ids (K,) and their (V,) column mask, made once per kind."""
        if kind not in self.stops:
            ids = torch.tensor(kind.stop_ids, dtype=torch.long, device=logits.device)
            cols = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
            cols[ids] = True
            self.stops[kind] = (ids, cols)
        return self.stops[kind]

    def forward(
        self, input_ids, attention_mask, position_ids, cache, *, record: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One cached forward of input_ids (N, S); the last position's logits (N, V) and,
        when ``record``, the experts every MoE layer routed each input token to
        ``(N * S, L, K)`` (:mod:`ardea.model.routing_replay`), else None."""
        kwargs = {self.cache_kwarg: cache, "use_cache": True}
        if self.keep_last:
            kwargs["logits_to_keep"] = 1
        # in eval mode (no dropout); a module shared with the trainer gets its modes back
        training = [m for m in self.modules if m.training]
        for m in training:
            m.training = False
        recording = record_routing(self.model) if record else contextlib.nullcontext()
        try:
            with recording as routing:
                out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids, **kwargs)  # fmt: skip
        finally:
            for m in training:
                m.training = True
        return out.logits[:, -1, :], routing.routes() if record else None


def additive_mask_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype for prepared 4D masks, or None when the model must build its own: attention
    other than sdpa / eager (e.g. flash, flex) or any sliding-window layer."""
    config = model.config
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        full = all(kind == "full_attention" for kind in layer_types)
    else:
        full = getattr(config, "sliding_window", None) is None
    return model.get_input_embeddings().weight.dtype if full else None


def request_tables(requests: Sequence[Request]) -> list[tuple[torch.Tensor | None, int]]:
    """Per request, the table (R, T) float64 holding its random numbers and its row in it:
    row ``row_id`` of the table of a call with its ``params`` (:func:`uniform_table`), one
    table shared by the requests with the same seed and ``max_new_tokens``; an unseeded
    request's row drawn from the global RNG; (None, 0) when greedy."""
    out: list[tuple[torch.Tensor | None, int]] = [(None, 0)] * len(requests)
    seeded: dict[tuple[int, int], list[int]] = {}
    for i, request in enumerate(requests):
        params = request.params
        if params.temperature == 0:
            continue
        if params.seed is None:
            out[i] = (seeded_table(None, 1, params.max_new_tokens), 0)
        else:
            seeded.setdefault((params.seed, params.max_new_tokens), []).append(i)
    for (seed, width), members in seeded.items():
        table = seeded_table(seed, max(requests[i].row_id for i in members) + 1, width)
        for i in members:
            out[i] = (table, requests[i].row_id)
    return out


def seeded_table(seed: int | None, rows: int, width: int) -> torch.Tensor:
    """(rows, width) float64 uniforms in [0, 1): the first ``rows`` rows of ``seed``'s
    table (a CPU generator fills it row by row, so a longer table starts with these), or
    drawn from the global RNG when ``seed`` is None."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return torch.rand((rows, width), generator=generator, dtype=torch.float64)


def uniform_table(n_rows: int, params: SamplingParams) -> torch.Tensor | None:
    """(rows, T) float64 uniforms in [0, 1): row r's draw at step t is entry
    (row_ids[r], t) of the call's table."""
    if params.temperature == 0:
        return None
    rows = params.rows(n_rows)
    first = min(rows, default=0)
    table = seeded_table(params.seed, max(rows, default=-1) + 1, params.max_new_tokens)
    if rows == list(range(first, first + n_rows)):
        return table[first:]  # a contiguous slice: no copy
    return table[torch.tensor(rows, dtype=torch.long)]

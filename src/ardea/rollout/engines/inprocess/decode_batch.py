"""The rows the in-process engine is decoding together: one :class:`DecodeBatch` per kind
of sampling (temperature, top-k, top-p, stop tokens and strings), rows joining it between
decode steps and leaving it when they end (:mod:`ardea.rollout.engines.inprocess.engine`).

Notation: ``N`` rows, ``C`` cache columns, ``L`` filled columns, ``T`` the longest
``max_new_tokens`` of the rows, ``V`` vocabulary.

Layout. Every row's keys and values sit in the same cache columns: a row's input (its prompt,
then the tokens of a resumed prefix) is right-aligned to end at the column where the batch's
inputs ended when it joined, so the rows' caches are left-padded to a common length ``L``
(``keys`` marks the real columns), and each step writes every row's new token into column
``L``. Positions are per row (``positions``: the position of the token fed next), so a row
sees exactly the positions it would see alone. A row's ``count`` is the number of tokens
its completion has (a resumed prefix included): its step-``t`` random number is
``uniforms[row, count]`` and it ends at ``count == max_new_tokens``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from ardea.rollout.engines.inprocess.kv_cache import merge_caches, select_rows
from ardea.rollout.request_state import RequestState


@dataclasses.dataclass(frozen=True)
class Kind:
    """What rows decoded together share: how they sample and what stops them."""

    temperature: float
    top_k: int
    top_p: float
    stop_ids: tuple[int, ...]
    stop: tuple[str, ...]
    routed_experts: bool = False  # record each token's experts (routing replay)

    @classmethod
    def of(cls, params, eos_ids) -> Kind:
        stops = tuple(sorted(set(eos_ids) | set(params.stop_token_ids)))
        return cls(params.temperature, params.top_k, params.top_p, stops, tuple(params.stop),
                   params.routed_experts)  # fmt: skip


@dataclasses.dataclass(eq=False)
class Row(RequestState):
    """A request inside the in-process engine: its state (:class:`RequestState`), its
    ``kind``, its random numbers for every position (row ``table_row`` of ``table (R, T)``,
    shared by the rows of one batch call; None when greedy) and its stop-string state."""

    kind: Kind | None = None
    table: torch.Tensor | None = None
    table_row: int = 0
    stop_seen: bool = False
    joined: int = 0  # len(input_ids) at its last prefill (0: none yet), for the FLOP count

    def restart(self) -> None:
        """Drop what was generated since the request's own prefix (same random numbers)."""
        self.reset()
        self.stop_seen = False

    @property
    def input_ids(self) -> list[int]:
        return list(self.request.prompt_ids) + self.tokens


class DecodeBatch:
    """The state of rows decoded together (module docstring): per row its position, token
    count, limits, random numbers, outputs and whether it is still running, plus the shared
    KV cache and the logits of every row's next token.

    Built by :meth:`ardea.rollout.engines.inprocess.continuous.Decoder.prefill` from freshly prefilled rows
    and grown by :meth:`join`."""

    def __init__(self, rows: list[Row], logits, cache, length, keys, positions, version):
        self.rows, self.logits, self.cache, self.length = rows, logits, cache, length
        self.keys, self.positions, self.version = keys, positions, version
        device = logits.device
        requests = [r.request for r in rows]
        self.count = torch.tensor([len(r.tokens) for r in rows], device=device)  # (N,)
        self.first = self.count.clone()  # (N,) tokens each row had when it joined
        self.limit = torch.tensor([q.params.max_new_tokens for q in requests], device=device)
        self.min_new = torch.tensor([q.params.min_new_tokens for q in requests], device=device)
        self.has_min_new = any(q.params.min_new_tokens > 0 for q in requests)
        self._additive: torch.Tensor | None = None  # (N, 1, 1, C) prepared mask
        width = int(self.limit.max())
        self.uniforms = _uniforms(rows, width, device)  # (N, T) float64, None when greedy
        self.tokens = torch.zeros(len(rows), width, dtype=torch.long, device=device)  # (N, T)
        self.token_logprobs = torch.zeros(len(rows), width, device=device)  # (N, T)
        self.alive = torch.ones(len(rows), dtype=torch.bool, device=device)
        self.n_alive = len(rows)
        self.routes: torch.Tensor | None = None  # (N, T, L, K) of fed tokens, -1 elsewhere

    @property
    def capacity(self) -> int:
        return self.keys.shape[1]

    @staticmethod
    def needed(rows: Sequence[Row]) -> int:
        """The most tokens any of ``rows`` may still generate."""
        return max(r.request.params.max_new_tokens - len(r.tokens) for r in rows)

    def step_uniforms(self) -> torch.Tensor | None:
        """(N,) each row's random number for its next token."""
        if self.uniforms is None:
            return None
        at = self.count.clamp_max(self.uniforms.shape[1] - 1)[:, None]
        return self.uniforms.gather(1, at)[:, 0]

    def record(self, tok: torch.Tensor, lp: torch.Tensor, stopped: torch.Tensor) -> list[int]:
        """Write each running row's sampled token and log-prob at its count; the rows
        (indices) that end with it: ``stopped`` (a stop token or string) or at their
        ``max_new_tokens``."""
        index = torch.arange(len(self.rows), device=tok.device)
        at = self.count.clamp_max(self.tokens.shape[1] - 1)
        self.tokens[index, at] = torch.where(self.alive, tok, self.tokens[index, at])
        self.token_logprobs[index, at] = torch.where(self.alive, lp, self.token_logprobs[index, at])
        self.count = self.count + self.alive.long()
        ended = self.alive & (stopped | (self.count >= self.limit))
        if not bool(ended.any()):  # the one host sync of a step
            return []
        self.alive &= ~ended
        self.n_alive = int(self.alive.sum())
        return ended.nonzero()[:, 0].tolist()

    def record_routes(self, routes: torch.Tensor) -> None:
        """The experts ``(N, L, K)`` that routed each running row's token just fed (its
        last one, at ``count - 1``)."""
        if self.routes is None:
            shape = (len(self.rows), self.tokens.shape[1], *routes.shape[1:])
            self.routes = torch.full(shape, -1, dtype=routes.dtype, device=routes.device)
        index = torch.arange(len(self.rows), device=routes.device)
        at = (self.count - 1).clamp(0, self.tokens.shape[1] - 1)
        self.routes[index, at] = torch.where(self.alive[:, None, None], routes,
                                             self.routes[index, at])  # fmt: skip

    def new_outputs(self, rows: list[int]) -> list[tuple]:
        """Per row index of ``rows``, its tokens and log-probs generated since it joined,
        and their routes (``(G, L, K)``, -1 for a token not fed) when recorded, else None."""
        if not rows:
            return []
        index = torch.tensor(rows, device=self.tokens.device)
        first, end = self.first[index].tolist(), self.count[index].tolist()
        tokens, logprobs = self.tokens[index].tolist(), self.token_logprobs[index].tolist()
        routes = [None] * len(rows) if self.routes is None else self.routes[index].cpu()
        return [
            (t[a:b], lp[a:b], None if r is None else r[a:b])
            for t, lp, r, a, b in zip(tokens, logprobs, routes, first, end)
        ]

    def step_keys(self) -> torch.Tensor:
        """(N, C) bool: the real keys when feeding the new tokens (column ``length``)."""
        return self.keys & (torch.arange(self.capacity, device=self.keys.device) <= self.length)

    def step_mask(self, dtype: torch.dtype | None) -> torch.Tensor:
        """The attention mask over the ``length + 1`` keys seen when feeding the new tokens:
        (N, 1, 1, length + 1) additive in ``dtype`` (0 = attend, dtype's min = masked),
        prepared once per batch, or (N, length + 1) 0/1 when ``dtype`` is None."""
        end = self.length + 1
        if dtype is None:
            return self.keys[:, :end].long()
        if self._additive is None:
            additive = torch.zeros(self.keys.shape, dtype=dtype, device=self.keys.device)
            self._additive = additive.masked_fill(~self.keys, torch.finfo(dtype).min)[:, None, None]
        return self._additive[..., :end]

    def advance(self) -> None:
        """After a forward of the new tokens: one more filled column and position."""
        self.length += 1
        self.positions = self.positions + 1

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the rows ``keep`` (a (K,) index)."""
        picked = keep.tolist()
        self.rows = [self.rows[i] for i in picked]
        for name in ("logits", "keys", "positions", "count", "first", "limit", "min_new",
                     "tokens", "token_logprobs", "alive"):  # fmt: skip
            setattr(self, name, getattr(self, name)[keep])
        if self.uniforms is not None:
            self.uniforms = self.uniforms[keep]
        if self.routes is not None:
            self.routes = self.routes[keep]
        if self._additive is not None:
            self._additive = self._additive[keep]
        select_rows(self.cache, keep)
        self.n_alive = int(self.alive.sum())

    def running(self) -> torch.Tensor:
        """(K,) the indices of rows still running."""
        return self.alive.nonzero()[:, 0]

    def join(self, other: DecodeBatch) -> DecodeBatch:
        """One batch holding this one's running rows (their outputs so far folded into them)
        and every row of ``other`` (freshly prefilled), their caches right-aligned at the
        longer of the two lengths, with room for the most tokens any row still needs."""
        self.fold()
        keep = self.running()
        if len(keep) < len(self.rows):
            self.select(keep)
        if not self.rows:
            return other
        length = max(self.length, other.length)
        capacity = length + self.needed(self.rows + other.rows)
        cache = merge_caches([self.cache, other.cache], [self.length, other.length], capacity)
        keys = torch.zeros(len(self.rows) + len(other.rows), capacity, dtype=torch.bool,
                           device=self.keys.device)  # fmt: skip
        keys[:, length:] = True
        keys[: len(self.rows), length - self.length : length] = self.keys[:, : self.length]
        keys[len(self.rows) :, length - other.length : length] = other.keys[:, : other.length]
        logits = torch.cat([self.logits, other.logits])
        positions = torch.cat([self.positions, other.positions])
        return DecodeBatch(self.rows + other.rows, logits, cache, length, keys, positions,
                           other.version)  # fmt: skip

    def fold(self) -> None:
        """Move each running row's new tokens into the row itself (before the batch is
        rebuilt or abandoned) so that the next batch starts counting from there."""
        running = self.running().tolist()
        for i, (tokens, logprobs, routes) in zip(running, self.new_outputs(running)):
            self.rows[i].extend(tokens, logprobs, self.version, routes)
        self.first = self.count.clone()


def _uniforms(rows: list[Row], width: int, device: torch.device) -> torch.Tensor | None:
    """(N, width) float64: each row's random numbers (zeros past its own), None when greedy;
    one gather when the rows share one table of that width (a batch call's rows)."""
    if rows[0].table is None:
        return None
    table = rows[0].table
    if table.shape[1] == width and all(r.table is table for r in rows):
        index = torch.tensor([r.table_row for r in rows], device=table.device)
        return table.index_select(0, index).to(device)
    out = torch.zeros(len(rows), width, dtype=torch.float64, device=device)
    for i, row in enumerate(rows):
        uniforms = row.table[row.table_row]
        out[i, : len(uniforms)] = uniforms.to(device)
    return out

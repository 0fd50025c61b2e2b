"""The state of one batch being decoded by the in-process engine: its outputs written step
by step (:class:`DecodeOutputs`) and its attention masks and positions (:class:`DecodeMasks`),
both shrinking as finished rows leave the batch (:mod:`ardea.rollout.inprocess`)."""

from __future__ import annotations

import torch

Result = tuple[list[int], list[float], str]  # a row's token ids, log-probs, finish reason


class DecodeOutputs:
    """Tokens and log-probs of one batch, written step by step while finished rows leave it."""

    def __init__(self, n: int, steps: int, pad: int, device: torch.device) -> None:
        self.tokens = torch.full((n, steps), pad, dtype=torch.long, device=device)  # (N, T)
        self.logprobs = torch.zeros(n, steps, device=device)  # (N, T)
        self.n_tokens = torch.zeros(n, dtype=torch.long, device=device)  # 0 = no stop yet
        self.rows: torch.Tensor | None = None  # batch row of each current row; None = all

    def index(self) -> torch.Tensor | slice:
        return slice(None) if self.rows is None else self.rows

    def write(self, t: int, tok: torch.Tensor, lp: torch.Tensor, stopped: torch.Tensor) -> None:
        """Record step t for the current rows; ``stopped`` rows end with this token."""
        rows = self.index()
        self.tokens[rows, t] = tok
        self.logprobs[rows, t] = lp
        self.n_tokens[rows] = torch.where(stopped, t + 1, self.n_tokens[rows])

    def select(self, keep: torch.Tensor) -> None:
        self.rows = keep if self.rows is None else self.rows[keep]

    def results(self) -> list[Result]:
        """Per batch row: tokens and log-probs up to its stop token (or all T), finish reason."""
        rows = zip(self.tokens.tolist(), self.logprobs.tolist(), self.n_tokens.tolist())
        return [(tok[:k], lp[:k], "stop") if k else (tok, lp, "length") for tok, lp, k in rows]


class DecodeMasks:
    """Attention masks and position ids of one left-padded batch.

    Prompt row i has ``lens[i]`` real tokens right-aligned in width ``P``; generated token t
    sits at column ``P + t`` and position ``lens[i] + t``. With ``dtype`` set, masks are
    prepared 4D additive float masks (0 = attend, dtype's min = masked) that the model uses
    as-is, which saves building one per step; with None they are the 2D 0/1 masks.
    """

    def __init__(self, lens: torch.Tensor, width: int, steps: int, dtype: torch.dtype | None):
        self.lens, self.width, self.dtype = lens, width, dtype
        cols = torch.arange(width + steps, device=lens.device)
        self.columns = cols  # (P + T,)
        self.keys = cols >= (width - lens)[:, None]  # (N, P + T) bool, True = real token
        if dtype is not None:
            self.additive = torch.zeros(self.keys.shape, dtype=dtype, device=lens.device)
            self.additive = self.additive.masked_fill(~self.keys, torch.finfo(dtype).min)
            self.additive = self.additive[:, None, None, :]  # (N, 1, 1, P + T)

    def prefill(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask ((N, 1, P, P) or (N, P)) and positions (N, P) = cumsum(mask) − 1, 0 on padding."""
        keys = self.keys[:, : self.width]  # (N, P)
        positions = (keys.long().cumsum(-1) - 1).clamp_min(0)
        if self.dtype is None:
            return keys.long(), positions
        causal = torch.ones(self.width, self.width, dtype=torch.bool, device=keys.device).tril()
        allowed = causal & keys[:, None, None, :]  # (N, 1, P, P)
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=keys.device)
        return mask.masked_fill(~allowed, torch.finfo(self.dtype).min), positions

    def step_keys(self, t: int) -> torch.Tensor:
        """(N, P + T) bool: the real keys when feeding generated token t (False from
        column P + t + 1 on)."""
        return self.keys & (self.columns <= self.width + t)

    def step(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask over the P + t + 1 keys seen when feeding generated token t; positions (N, 1)."""
        end = self.width + t + 1
        mask = self.keys[:, :end].long() if self.dtype is None else self.additive[..., :end]
        return mask, (self.lens + t)[:, None]

    def select(self, index: torch.Tensor) -> None:
        """Keep (or repeat) the rows in ``index``."""
        self.lens, self.keys = self.lens[index], self.keys[index]
        if self.dtype is not None:
            self.additive = self.additive[index]

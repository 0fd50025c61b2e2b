"""What an engine keeps of a request while it serves it: the completion so far (a resumed
prefix, then what each stretch of decoding under one policy version added), so that it can
be handed out when the request ends or is aborted, and go on under new weights."""

from __future__ import annotations

import dataclasses
import time

import torch

from ardea.rollout.engine import Completion, Request, RequestHandle


@dataclasses.dataclass(eq=False)
class RequestState:
    """A request being served: its ``handle``, the completion so far (``tokens``,
    ``logprobs``, ``spans``), when it was ``submitted`` (``time.perf_counter``) and, when the
    request asks for them, the ``routes`` of its prompt and tokens so far (``(P + G, L, K)``,
    :attr:`Completion.routed_experts`)."""

    handle: RequestHandle
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    submitted: float = dataclasses.field(default_factory=time.perf_counter)
    routes: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not self.tokens and self.request.prefix is not None:
            self.reset()

    @property
    def request(self) -> Request:
        return self.handle.request

    def reset(self) -> None:
        """Back to the request's own prefix (none: nothing)."""
        prefix = self.request.prefix
        self.tokens = [] if prefix is None else list(prefix.token_ids)
        self.logprobs = [] if prefix is None else list(prefix.logprobs)
        self.spans = [] if prefix is None else list(prefix.spans)
        self.routes = None  # the next prefill routes the input again

    def extend(
        self,
        tokens: list[int],
        logprobs: list[float],
        version: int,
        routes: torch.Tensor | None = None,
    ) -> None:
        """Append tokens generated under weights ``version`` (a new span when it changed)
        and, recording routing, their ``routes`` (``(len(tokens), L, K)``)."""
        if tokens and (not self.spans or self.spans[-1][1] != version):
            self.spans.append((len(self.tokens), version))
        self.tokens += tokens
        self.logprobs += logprobs
        if routes is not None and self.routes is not None:
            self.routes = torch.cat([self.routes, routes])

    def completion(self, finish: str, version: int) -> Completion:
        """The completion so far; ``version``: the engine's, for a request with no tokens."""
        spans = self.spans or [(0, version)]
        seconds = time.perf_counter() - self.submitted
        return Completion(list(self.request.prompt_ids), list(self.tokens),
                          list(self.logprobs), finish, spans[0][1], list(spans), seconds,
                          self._routes())  # fmt: skip

    def _routes(self) -> torch.Tensor | None:
        """The routes of prompt and tokens, -1 for a token the engine has not run (a row that
        ended at the token its prefill sampled has routes for its input only)."""
        if self.routes is None:
            return None
        missing = len(self.request.prompt_ids) + len(self.tokens) - self.routes.shape[0]
        pad = self.routes.new_full((missing, *self.routes.shape[1:]), -1)
        return torch.cat([self.routes, pad])

"""A pool of vLLM servers: requests spread by load, the calls of one episode on one server,
a server that dies taken out and its requests run elsewhere.

**Routing** (:meth:`ServerPool.stream`). A request may carry an affinity key: the engine
gives the row id of its first sample when the call names its rows
(:attr:`~ardea.rollout.SamplingParams.row_ids`), and every call of an agent episode or a
workflow episode carries its episode's row id. The first request of a key goes to the live
server with the fewest requests in flight (ties: the lowest index) and the key stays on that
server, so a conversation's turns find their prefix in that server's cache; a request
without a key goes to the least loaded server. The keys are forgotten when the weights
change (:meth:`ServerPool.forget`: a reload empties every prefix cache anyway).

**Failures.** A server that does not answer (refused or dropped connection, or no answer
within ``rollout.vllm.timeout_s``) is taken out of the pool, its keys are forgotten, and the
request goes on on another live server from the tokens it has (a request with none yet runs
again with the same body: the same seed, so the same tokens where the servers hold the same
weights). When no server is left, servers the pool
launched are restarted on the current weights (up to ``rollout.vllm.max_restarts`` each);
otherwise the call fails naming every server. At each weight update the engine restarts the
launched servers that died (before the reload, so they load the new weights); a server the
user started stays out once it failed.

**Metrics** (:meth:`ServerPool.metrics`, totals since the run started, ``i`` = the server's
place in ``rollout.vllm.urls`` or launch order): ``vllm/server<i>_requests``,
``vllm/server<i>_tokens`` (generated), ``vllm/server<i>_peak_in_flight``,
``vllm/server<i>_restarts``, ``vllm/server<i>_up`` and ``vllm/retried_requests``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ardea.rollout.engines.vllm.server import LaunchedServer, VLLMServerError


class VLLMServerDown(VLLMServerError):
    """A vLLM server did not answer: its connection failed or its time ran out."""


@dataclass
class PoolServer:
    """One server of the pool and its counts."""

    index: int
    url: str
    launched: LaunchedServer | None = None
    up: bool = True
    in_flight: int = 0
    peak_in_flight: int = 0
    requests: int = 0
    tokens: int = 0
    restarts: int = 0
    last_error: str = ""


Request = Callable[[str, str, "dict[str, Any] | None", str], Any]


class ServerPool:
    """Routes the engine's requests over its servers (module docstring).

    Args:
        servers: the pool, in ``rollout.vllm.urls`` or launch order.
        request: ``request(url, path, body, call)`` → the reply's JSON; raises
            :class:`VLLMServerDown` when the server does not answer.
        max_restarts: restarts of each launched server (``rollout.vllm.max_restarts``).
        started: called with a server that was just restarted (to check it), before it
            takes requests.
    """

    def __init__(
        self,
        servers: list[PoolServer],
        *,
        request: Request,
        max_restarts: int,
        started: Callable[[PoolServer], None] = lambda server: None,
    ) -> None:
        if not servers:
            raise ValueError("a server pool needs at least one server")
        self.servers = servers
        self.request = request
        self.max_restarts = max_restarts
        self.started = started
        self.retried = 0
        self._keys: dict[int, PoolServer] = {}
        self._lock = threading.Lock()

    @property
    def live(self) -> list[PoolServer]:
        return [s for s in self.servers if s.up]

    # ------------------------------------------------------------------ requests
    def stream(
        self, key: int | None, segment: Callable[[str], tuple[str | None, int]]
    ) -> str | None:
        """One segment of a request on the key's server (module docstring):
        ``segment(url)`` streams it and returns its finish reason (None: stopped) and the
        tokens it generated. A server that does not answer is taken out and None returned,
        so the request's next segment goes on from its tokens so far on another server."""
        server = self._take(key)
        url = server.url
        try:
            finish, tokens = segment(url)
        except VLLMServerDown as error:
            self.take_out(server, url, error)
            with self._lock:
                self.retried += 1
            return None
        finally:
            with self._lock:
                server.in_flight -= 1
        with self._lock:
            server.requests += finish is not None  # a request counts once: where it ends
            server.tokens += tokens
        return finish

    def _take(self, key: int | None) -> PoolServer:
        """The server for ``key``, one more request in flight on it; restarts launched
        servers when none is up, and fails naming every server when none can be."""
        with self._lock:
            server = self._keys.get(key) if key is not None else None
            if server is None or not server.up:
                if not self.live:
                    self._restart_any()
                server = min(self.live, key=lambda s: (s.in_flight, s.index))
                if key is not None:
                    self._keys[key] = server
            server.in_flight += 1
            server.peak_in_flight = max(server.peak_in_flight, server.in_flight)
            return server

    def take_out(self, server: PoolServer, url: str, error: Exception) -> None:
        """``server`` did not answer at ``url``: no request goes to it until it is
        restarted (a failure from before a restart, at its old URL, changes nothing)."""
        with self._lock:
            if server.up and server.url == url:
                server.up, server.last_error = False, str(error)
                self._keys = {k: s for k, s in self._keys.items() if s is not server}

    def require_live(self) -> None:
        """At least one server up: restarts launched ones when none is, else fails naming
        every server."""
        with self._lock:
            if not self.live:
                self._restart_any()

    def follow(self, urls: list[str | None]) -> None:
        """The servers as the engine that leads left them (a follower's pool under torchrun:
        a restarted server at its new URL; None: down there)."""
        with self._lock:
            for server, url in zip(self.servers, urls, strict=True):
                server.up = url is not None
                server.url = url or server.url
                server.last_error = "" if server.up else "down on rank 0"

    def forget(self) -> None:
        """Drop every key (the weights changed: the prefix caches are empty)."""
        with self._lock:
            self._keys.clear()

    # ------------------------------------------------------------------ restarts
    def restart_dead(self) -> list[PoolServer]:
        """Restart every launched server that is down and has restarts left (on the weights
        last written); the servers restarted."""
        with self._lock:
            return [s for s in self.servers if not s.up and self._restart(s)]

    def _restart_any(self) -> None:
        """With no server up: restart what can be, else fail naming every server."""
        if not any(self._restart(s) for s in self.servers):
            raise VLLMServerError(
                "every vLLM server of rollout.vllm.urls is down: "
                + "; ".join(f"{s.url}: {s.last_error or 'down'}" for s in self.servers)
                + ". Nothing was lost: the last checkpoint is intact"
            )

    def _restart(self, server: PoolServer) -> bool:
        if server.launched is None or server.restarts >= self.max_restarts:
            return False
        server.launched.stop()
        server.url = server.launched.start()
        server.restarts += 1
        self.started(server)
        server.up, server.last_error = True, ""
        return True

    def metrics(self) -> dict[str, float]:
        out = {"vllm/retried_requests": float(self.retried)}
        for s in self.servers:
            name = f"vllm/server{s.index}"
            out |= {
                f"{name}_requests": float(s.requests),
                f"{name}_tokens": float(s.tokens),
                f"{name}_peak_in_flight": float(s.peak_in_flight),
                f"{name}_restarts": float(s.restarts),
                f"{name}_up": float(s.up),
            }
        return out

"""How an agent workflow's calls reach the runner's lockstep: the runner's one app (or
server) serves every rollout call under way, :class:`Sessions` telling which call's
recording client an episode's request belongs to, and :class:`NumberedTransport` numbering
each call as the workflow's code sends it (:mod:`ardea.agent.lockstep`)."""

from __future__ import annotations

import threading

import httpx

from ardea.agent.client import RecordingClient
from ardea.agent.lockstep import CALL_HEADER, EPISODE_HEADER, Lockstep
from ardea.agent.request_checks import RequestError


class Sessions:
    """The recording clients of the runner's calls under way, by episode id: which one
    serves a request (:class:`~ardea.agent.server.Clients`)."""

    def __init__(self) -> None:
        self._clients: dict[int, RecordingClient] = {}
        self._lock = threading.Lock()

    def open(self, client: RecordingClient, episodes: list[int]) -> None:
        with self._lock:
            self._clients.update(dict.fromkeys(episodes, client))

    def close(self, episodes: list[int]) -> None:
        with self._lock:
            for e in episodes:
                self._clients.pop(e, None)

    def client(self, episode: int | None) -> RecordingClient:
        if episode is None:
            raise RequestError(
                f"{EPISODE_HEADER}: a request to agent workflows' server names its episode "
                "(the client the workflow is given sends it)", param=EPISODE_HEADER,
            )  # fmt: skip
        with self._lock:
            client = self._clients.get(episode)
        if client is None:
            raise RequestError(
                f"{EPISODE_HEADER}: episode {episode} is not running (it ended or timed out)",
                param=EPISODE_HEADER, status=409, code="episode_not_running",
            )  # fmt: skip
        return client


class NumberedTransport(httpx.AsyncBaseTransport):
    """Numbers each call of an episode as its code sends it (:meth:`Lockstep.issue`), in
    the ``x-ardea-call`` header, then sends it with ``inner``."""

    def __init__(self, inner: httpx.AsyncBaseTransport, lockstep: Lockstep) -> None:
        self.inner = inner
        self.lockstep = lockstep

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        episode = request.headers.get(EPISODE_HEADER)
        if episode is None or not request.url.path.endswith(("/chat/completions", "/responses")):
            return await self.inner.handle_async_request(request)
        number = self.lockstep.issue(int(episode))
        request.headers[CALL_HEADER] = str(number)
        try:
            return await self.inner.handle_async_request(request)
        except BaseException:
            self.lockstep.lost(int(episode), number)  # unless it arrived (then a no-op)
            raise

    async def aclose(self) -> None:
        await self.inner.aclose()

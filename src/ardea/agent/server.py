"""The recording client over HTTP: an OpenAI-compatible ``/v1/chat/completions`` endpoint
(FastAPI, served by uvicorn on loopback by default).

Agent code pointed at ``base_url = server.url`` (e.g. ``openai.OpenAI(base_url=server.url,
api_key="-")``) runs unchanged; every call is served and recorded by the wrapped
:class:`~ardea.agent.client.RecordingClient`, so concurrent HTTP calls are batched like
in-process ones (FastAPI runs each request in a worker thread). Routes:

- ``POST /v1/chat/completions``: the chat completion, or with ``stream=True`` its chunks as
  server-sent events (a bad request, e.g. an unsupported option or a rewritten history, is
  a 400 with the OpenAI error body naming the problem);
- ``GET /v1/models``: the one model served (any ``model`` name is accepted);
- ``POST /v1/rewards`` with ``{"completion_id": ..., "reward": ...}``: attach a reward.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ardea.agent.client import RecordingClient
from ardea.agent.streaming import ChunkStream, server_sent_events
from ardea.errors import ArdeaError

START_TIMEOUT = 30.0


def build_app(client: RecordingClient) -> FastAPI:
    """The FastAPI app serving ``client`` (module docstring)."""
    app = FastAPI(title="ardea recording client")

    @app.post("/v1/chat/completions")
    def chat_completions(body: dict[str, Any]):
        try:
            result = client.create(**body)
        except (ArdeaError, TypeError, ValueError, KeyError) as exc:
            return _error(str(exc), 400)
        if isinstance(result, ChunkStream):  # generated already: errors came before this
            return StreamingResponse(server_sent_events(result), media_type="text/event-stream")
        return result.model_dump(exclude_none=True)

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "ardea", "object": "model", "owned_by": "ardea"}]}

    @app.post("/v1/rewards")
    async def rewards(request: Request):
        body = await request.json()
        try:
            client.set_reward(str(body["completion_id"]), float(body["reward"]))
        except (KeyError, TypeError, ValueError) as exc:
            return _error(f"cannot attach the reward: {exc}", 400)
        return {"ok": True}

    return app


def _error(message: str, status: int) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
    return JSONResponse(body, status_code=status)


class ChatServer:
    """Serve ``client`` on ``host:port`` in a background thread (``port=0``: a free port).

    Use as a context manager, or call :meth:`start` and :meth:`stop`; :attr:`url` is the
    ``base_url`` for an OpenAI client.
    """

    def __init__(self, client: RecordingClient, *, host: str = "127.0.0.1", port: int = 0):
        self.client = client
        self.host = host
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(build_app(client), log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> ChatServer:
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise ArdeaError(f"the chat server on {self.host}:{self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._socket.close()

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

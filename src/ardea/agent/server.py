"""The recording client over HTTP: OpenAI-compatible endpoints (FastAPI, served by uvicorn
on loopback by default).

Agent code pointed at ``base_url = server.url`` (e.g. ``openai.OpenAI(base_url=server.url,
api_key="-")``) runs unchanged; every call is served and recorded by the wrapped
:class:`~ardea.agent.client.RecordingClient`, so concurrent HTTP calls are batched like
in-process ones. Routes:

- ``POST /v1/chat/completions``: the chat completion, or with ``stream=True`` its chunks as
  server-sent events;
- ``POST /v1/responses``: the Responses API subset of :mod:`ardea.agent.responses_api`
  (``previous_response_id`` refers to responses of this server);
- ``GET /v1/models``: the one model served (any ``model`` name is accepted);
- a request with the header ``x-ardea-episode: <n>`` is a call of agent workflow episode
  ``n`` (:mod:`ardea.agent.workflows` sets it on the client it gives the workflow), served
  in lockstep with the other episodes' calls (:mod:`ardea.agent.lockstep`); which recording
  client serves it is the app's :class:`Clients`' choice (a workflow runner's one app serves
  all its rollout calls); to a server without workflows the header is a 400;
- ``POST /v1/rewards`` with ``{"completion_id": ..., "reward": ..., "choice"?: k}``: attach
  a finite reward to a completion (or a response id).

Robustness. Every refusal is a 4xx with OpenAI's error body ``{"error": {"message", "type",
"param", "code"}}`` naming the field (:mod:`ardea.agent.request_checks`), including
malformed JSON and unknown routes. Who may call, body size (after decompression), content
types and requests in flight are the shared HTTP layer's (:mod:`ardea.agent.http_guard`,
:class:`ServerLimits`). Bodies are parsed and prompts tokenised in the
request's own worker thread, outside the engine's batch, so one large request cannot stall
the others. A reply whose client went away before it was delivered (a timeout, a retry) is
marked an orphan: never continued, never exported, counted.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from typing import Any, Protocol

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ardea.agent.client import RecordingClient
from ardea.agent.http_guard import Guard, ServerLimits, check_exposure
from ardea.agent.interaction import HistoryRewriteError
from ardea.agent.lockstep import CALL_HEADER, EPISODE_HEADER
from ardea.agent.request_checks import MAX_DEPTH, RequestError, check_reward, fail, shown
from ardea.agent.responses_api import chat_request, output_messages, response_events, response_of
from ardea.agent.streaming import ChunkStream, server_sent_events
from ardea.errors import ArdeaError

START_TIMEOUT = 30.0
MAX_STORED_RESPONSES = 4096  # Responses API conversations kept for previous_response_id
INLINE_JSON_BYTES = 64 * 2**10  # larger bodies are parsed in a worker thread


class Clients(Protocol):
    """Which recording client serves a request: ``client(episode)``, the episode its
    ``x-ardea-episode`` header names (None without one), or a RequestError."""

    def client(self, episode: int | None) -> RecordingClient: ...


class OneClient:
    """Every request to one client (``ardea serve``, :class:`ChatServer`); an episode header
    only when the client is running agent workflows."""

    def __init__(self, client: RecordingClient) -> None:
        self.one = client

    def client(self, episode: int | None) -> RecordingClient:
        if episode is not None and self.one.lockstep is None:
            raise RequestError(
                f"{EPISODE_HEADER}: this server runs no agent workflows (the header is set by "
                "ardea's workflow runner only)", param=EPISODE_HEADER,
            )  # fmt: skip
        return self.one


def build_app(clients: RecordingClient | Clients) -> FastAPI:
    """The FastAPI app serving ``clients`` (one client, or a :class:`Clients` choosing by
    episode: module docstring); :class:`ChatServer` puts the shared HTTP layer around it."""
    if isinstance(clients, RecordingClient):
        clients = OneClient(clients)
    app = FastAPI(title="ardea recording client")
    _install_error_handlers(app)
    stored: dict[str, list[dict[str, Any]]] = {}  # response id → its conversation's messages

    async def read_json(request: Request) -> Any:
        return await _read_json(request)

    async def serve(request: Request, options: Any):
        return await _serve(clients, request, options)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        try:
            client, result = await serve(request, await read_json(request))
        except Exception as exc:
            return _refusal(exc)
        if isinstance(result, ChunkStream):
            chunks = list(result)
            events = server_sent_events(chunks)
            return await _deliver(request, client, chunks[0].id, events)
        return await _deliver(request, client, result.id, result.model_dump(exclude_none=True))

    @app.post("/v1/responses")
    async def responses(request: Request):
        try:
            body = await read_json(request)
        except Exception as exc:
            return _refusal(exc)
        return await _respond(clients, stored, request, body)

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "ardea", "object": "model", "owned_by": "ardea"}]}

    @app.post("/v1/rewards")
    async def rewards(request: Request):
        try:
            completion_id, reward, choice = check_reward(await read_json(request))
            clients.client(_episode(request)).set_reward(completion_id, reward, choice)
        except Exception as exc:
            return _refusal(exc)
        return {"ok": True}

    return app


async def _respond(clients: Clients, stored: dict[str, list[dict[str, Any]]], request, body):
    """A Responses API request (:mod:`ardea.agent.responses_api`) served as a chat request;
    ``stored``: each response's conversation, for ``previous_response_id``."""
    try:
        converted = chat_request(body, lambda rid: _earlier(stored, rid))
    except Exception as exc:
        return _refusal(exc)
    try:
        client, completion = await _serve(clients, request, converted.options)
    except RequestError as exc:  # checked as a chat request: name the Responses field
        return _refusal(converted.renamed(exc))
    except Exception as exc:
        return _refusal(exc)
    rid = f"resp_{uuid.uuid4().hex[:24]}"
    response = response_of(completion, rid, body)
    client.alias(rid, completion.id)
    stored[rid] = [*converted.options["messages"], *output_messages(response)]
    while len(stored) > MAX_STORED_RESPONSES:  # the oldest go first (dicts keep order)
        del stored[next(iter(stored))]
    stream = converted.stream
    payload = response_events(response) if stream else response.model_dump(mode="json")
    return await _deliver(request, client, completion.id, payload)


def _install_error_handlers(app: FastAPI) -> None:
    """Unknown routes, invalid bodies and server failures answered with OpenAI's error body."""

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return _error(RequestError(message, status=exc.status_code, kind=kind))

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception):
        return _refusal(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return _error(fail(None, f"invalid request: {exc.errors()}"))


async def _read_json(request: Request) -> Any:
    """The body as JSON (its size bounded by the HTTP layer), parsed in a worker thread when
    large; malformed a 400."""
    body = await request.body()
    try:
        if len(body) <= INLINE_JSON_BYTES:  # a thread hop costs more than parsing it here
            return json.loads(bytes(body))
        return await run_in_threadpool(json.loads, bytes(body))
    except (ValueError, UnicodeDecodeError) as exc:
        raise fail(None, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:  # deeper than the decoder's recursion limit
        raise fail(None, f"the request body is nested more than {MAX_DEPTH} levels deep") from None


async def _deliver(request: Request, client: RecordingClient, completion_id: str, payload):
    """Send ``payload`` (a JSON body, or server-sent events); a client gone before it is
    delivered makes the call an orphan."""
    if await request.is_disconnected():
        client.mark_orphan(completion_id)
    if isinstance(payload, dict):
        return JSONResponse(payload)

    def events():
        delivered = False
        try:
            yield from payload
            delivered = True
        finally:
            if not delivered:
                client.mark_orphan(completion_id)

    return StreamingResponse(events(), media_type="text/event-stream")


async def _serve(clients: Clients, request: Request, options: Any):
    """The client serving a chat request and its completion: in lockstep for an agent
    workflow's call (the episode header set), else decoded with concurrent calls, in a
    worker thread."""
    if not isinstance(options, dict):
        raise fail(None, f"the request body must be a JSON object, got {shown(options)}")
    episode = _episode(request)
    client = clients.client(episode)  # checked before the lockstep is looked at
    if episode is not None:
        number = request.headers.get(CALL_HEADER)
        number = _header_number(CALL_HEADER, number) if number is not None else None
        return client, await client.lockstep.create(client, episode, options, number)
    return client, await run_in_threadpool(lambda: client.create(**options))


def _episode(request: Request) -> int | None:
    """The episode a request's header names (None: no header)."""
    value = request.headers.get(EPISODE_HEADER)
    return None if value is None else _header_number(EPISODE_HEADER, value)


def _header_number(name: str, value: str) -> int:
    """A header's non-negative integer (ASCII digits, at most 18 of them)."""
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        raise RequestError(f"{name}={shown(value)} is not a number", param=name)
    return int(value)


def _earlier(stored: dict[str, list[dict[str, Any]]], response_id: str) -> list[dict[str, Any]]:
    if response_id not in stored:
        raise fail("previous_response_id", f"no response {shown(response_id)} on this server",
                   code="previous_response_not_found")  # fmt: skip
    return stored[response_id]


def _refusal(exc: Exception) -> JSONResponse:
    """The response of a request that failed: a 4xx for anything the request did, a 500
    (still OpenAI-shaped) for a failure of the server itself."""
    if isinstance(exc, RequestError):
        return _error(exc)
    if isinstance(exc, HistoryRewriteError):
        return _error(RequestError(str(exc), param="messages", code="history_rewritten"))
    if isinstance(exc, ArdeaError | TypeError | ValueError):
        return _error(RequestError(str(exc)))
    message = f"the server failed: {type(exc).__name__}: {exc}"
    return _error(RequestError(message, status=500, kind="server_error"))


def _error(exc: RequestError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def openai_error(status: int, message: str, code: str) -> dict[str, Any]:
    """A refusal of the HTTP layer in OpenAI's error body."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return RequestError(message, status=status, kind=kind, code=code).body()


class AppServer:
    """Serve an ASGI ``app`` on ``host:port`` with uvicorn in a background thread
    (``port=0``: a free port), behind the shared HTTP layer (:class:`ServerLimits`; its
    refusals shaped by ``error_body``); a context manager, or :meth:`start` and :meth:`stop`.
    Binding beyond loopback needs an API key."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, name: str = "server",
                 limits: ServerLimits | None = None, error_body=openai_error):  # fmt: skip
        self.host = host
        self.name = name
        self.limits = limits or ServerLimits()
        check_exposure(host, self.limits, name)
        self.app = Guard(app, self.limits, host, error_body)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def start(self):
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise ArdeaError(f"the {self.name} on {self.host}:{self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._socket.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ChatServer(AppServer):
    """Serve ``client`` (one client, or :class:`Clients` choosing by episode) on
    ``host:port`` in a background thread (``port=0``: a free port).

    Use as a context manager, or call :meth:`start` and :meth:`stop`; :attr:`url` is the
    ``base_url`` for an OpenAI client. ``limits``: body size, requests in flight, API key.
    """

    def __init__(
        self,
        client: RecordingClient | Clients,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: ServerLimits | None = None,
    ):
        self.client = client
        super().__init__(build_app(client), host=host, port=port, name="chat server",
                         limits=limits)  # fmt: skip

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

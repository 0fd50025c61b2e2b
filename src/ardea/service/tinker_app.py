"""HTTP routes of the Tinker API (``/api/v1/...``) over :class:`TinkerService` (FastAPI).

What the pinned SDK needs of a server besides the operations: ``client/config`` (it must
say ``use_pyqwest_transport: false`` so the client speaks plain HTTP/JSON), a session,
heartbeats and telemetry (accepted and dropped), ``sessions/{id}/finish``, and
``retrieve_future`` held open up to :data:`POLL_SECONDS` until the result is there
(``{"type": "try_again"}`` otherwise: the client polls again at once). A failed operation
answers its poll with ``{"error": <message>, "category": "user" | "server"}``, which the
SDK raises as ``RequestFailedError`` with that message; a request the server refuses
outright is a 400 whose ``detail`` names the field (429 when it is over a limit on work in
flight: the SDK sends it again). Protobuf results go out as ``application/x-protobuf``.
Who may call and how large a body may be are the shared HTTP layer's
(:mod:`ardea.agent.http_guard`): ``forward_backward`` takes ``application/x-protobuf``
(zstd-compressed when the client says so), every other route JSON. The API key, when the
server has one, is the SDK's own ``X-API-Key`` (the SDK insists that it start with ``tml-``).
"""

from __future__ import annotations

import json
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from ardea.errors import ArdeaError
from ardea.service.tinker_fields import SESSION_ID, shown
from ardea.service.tinker_service import TinkerService
from ardea.service.tinker_wire import PROTOBUF, Busy, WireError

POLL_SECONDS = 20.0  # under the SDK's 45 s read timeout of retrieve_future
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False, "use_pyqwest_transport": False, "proto_compress_fwdbwd": False,
    "parallel_fwdbwd_chunks": False, "fwdbwd_max_chunk_len": 1024,
    "fwdbwd_max_chunk_bytes_count": 5_000_000, "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False, "sample_join_sampling_session": False,
}  # fmt: skip


def _error(exc: BaseException) -> dict[str, str]:
    category = "user" if isinstance(exc, ArdeaError | ValueError) else "server"
    return {"error": f"{type(exc).__name__}: {exc}", "category": category}


def _result(value: Any) -> Response:
    if isinstance(value, tuple) and value[0] == "proto":
        return Response(value[1], media_type=PROTOBUF)
    return JSONResponse(value)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON (numbers must be finite)")


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(raw or b"{}", parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise WireError("the body is nested too deeply to be a request") from None
    if not isinstance(parsed, dict):
        raise WireError("the body must be a JSON object")
    return parsed


async def body(request: Request) -> dict[str, Any]:
    """The request's JSON object (a 400 naming the problem otherwise), parsed in a worker
    thread (a deep or large body does not hold up the event loop)."""
    return await run_in_threadpool(_parse, await request.body())


def error_body(_status: int, message: str, code: str) -> dict[str, str]:
    """A refusal as the SDK reads it (``detail``), for the shared HTTP layer too."""
    return {"detail": message, "code": code}


def build_app(service: TinkerService) -> FastAPI:
    app = FastAPI(title="ardea Tinker-compatible API")

    @app.exception_handler(ArdeaError)
    async def refused(_request: Request, exc: ArdeaError) -> JSONResponse:
        status = 429 if isinstance(exc, Busy) else 400
        headers = {"retry-after": "1"} if status == 429 else None
        return JSONResponse({"detail": str(exc)}, status_code=status, headers=headers)

    @app.exception_handler(Exception)
    async def failed(_request: Request, exc: Exception) -> JSONResponse:
        message = f"the server failed: {type(exc).__name__}: {exc}"
        return JSONResponse({"detail": message}, status_code=500)

    def post(path: str, operation) -> None:
        async def handler(request: Request) -> JSONResponse:
            return JSONResponse(await run_in_threadpool(operation, await body(request)))

        app.post(f"/api/v1/{path}")(handler)

    post("client/config", lambda _b: CLIENT_CONFIG)
    post("create_session", lambda _b: {"type": "create_session",
                                       "session_id": service.new_session()})  # fmt: skip
    post("session_heartbeat", lambda _b: {"type": "session_heartbeat"})
    post("telemetry", lambda _b: {"status": "accepted"})
    post("create_model", service.create_model)
    post("get_info", service.get_info)
    post("optim_step", service.optim_step)
    post("save_weights", service.save_state)
    post("save_weights_for_sampler", service.save_for_sampler)
    post("load_weights", service.load_state)
    post("create_sampling_session", service.create_sampling_session)
    post("asample", service.asample)
    post("weights_info", service.weights_info)

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str) -> JSONResponse:
        if not SESSION_ID.fullmatch(session_id):
            raise WireError(f"{shown(session_id)} is not a session id")
        return JSONResponse({"session_id": session_id})

    _future_routes(app, service)
    _rest_routes(app, service)
    return app


def _future_routes(app: FastAPI, service: TinkerService) -> None:
    """forward_backward (a protobuf body) and the polling of every operation's future."""

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> JSONResponse:
        raw = await request.body()  # decompressed by the HTTP layer
        return JSONResponse(await run_in_threadpool(service.forward_backward, raw))

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        request_id, future = service.future(await body(request))
        if future is None:
            return JSONResponse({"detail": f"unknown request_id {request_id!r}"}, status_code=404)
        try:
            value = await run_in_threadpool(future.result, POLL_SECONDS)
        except FutureTimeout:
            return JSONResponse({"type": "try_again", "request_id": request_id,
                                 "queue_state": "active"})  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - the operation's failure, reported
            return JSONResponse(_error(exc))
        return _result(value)


def _rest_routes(app: FastAPI, service: TinkerService) -> None:
    """The immediate (non-future) reads: capabilities, samplers, runs, checkpoints."""

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities() -> JSONResponse:
        return JSONResponse(service.capabilities())

    @app.get("/api/v1/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/api/v1/samplers/{session}")
    async def sampler(session: str) -> JSONResponse:
        return JSONResponse(service.sampler_info(session))  # the id is checked there

    @app.get("/api/v1/training_runs/{model_id}")
    async def training_run(model_id: str) -> JSONResponse:
        return JSONResponse(service.training_run(model_id))

    @app.get("/api/v1/training_runs/{model_id}/checkpoints")
    async def checkpoints(model_id: str) -> JSONResponse:
        return JSONResponse({"checkpoints": service.store.checkpoints(model_id), "cursor": None})

    @app.delete("/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id:path}")
    async def delete_checkpoint(model_id: str, checkpoint_id: str) -> JSONResponse:
        service.store.delete(model_id, checkpoint_id)
        return JSONResponse({"deleted": checkpoint_id})

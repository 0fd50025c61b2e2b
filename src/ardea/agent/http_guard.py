"""The HTTP layer every server ardea starts shares: who may call it and how much one call
may ask, checked before a route sees the request.

:class:`Guard` is an ASGI middleware around a server's app. In order, a request is refused

1. 403 when it comes from a browser page of another origin: its ``Host`` is not a name the
   server answers to (a DNS-rebinding page names its own domain), it carries an ``Origin``
   other than the server's own, ``Sec-Fetch-Site: cross-site|same-site``, or it is a CORS
   preflight (``OPTIONS``): no CORS header is ever sent, so a web page can neither read an
   answer nor send anything but a "simple" request, which rule 3 refuses;
2. 401 without the server's API key, when it has one (``X-API-Key: <key>``, as the Tinker
   SDK sends it, or ``Authorization: Bearer <key>``, as the OpenAI SDK does), compared in
   constant time;
3. 415 when a body comes with a ``Content-Type`` the route does not take (a form or
   ``text/plain`` post, the only kinds a page may send without a preflight), or with a
   ``Content-Encoding`` other than ``identity``, ``gzip`` or ``zstd``;
4. 429 when ``max_in_flight`` requests are already being served (``Retry-After: 1``: the
   SDKs retry);
5. 413 when the body is over ``max_body_bytes`` — from its ``Content-Length`` before it is
   read, while it is read, and after decompression, which stops at the limit, so a small
   compressed body cannot inflate to gigabytes; 400 when it does not decompress.

A compressed body reaches the app decompressed (``Content-Encoding`` removed). Each server
shapes the refusal's JSON its clients parse (``error_body``). Binding beyond loopback
without a key is refused where the server is built (:func:`check_exposure`).
"""

from __future__ import annotations

import hmac
import io
import json
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from starlette.concurrency import run_in_threadpool

from ardea.errors import ArdeaError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARD = ("0.0.0.0", "::", "")
JSON = ("application/json",)
INLINE_BYTES = 2**20  # bodies larger than this are decompressed in a worker thread


@dataclass(frozen=True)
class ServerLimits:
    """What one server accepts (module docstring). ``body_types``: the ``Content-Type``\\ s a
    route takes, by path (an exact path, or a prefix ending in ``/``); others take JSON."""

    max_body_bytes: int = 8 * 2**20
    max_in_flight: int = 256
    api_key: str | None = None
    body_types: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_in_flight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArdeaError(f"server limit {name}={value!r}: must be an integer >= 1")
        if self.api_key is not None and (not self.api_key or not self.api_key.isprintable()):
            raise ArdeaError("--api-key must be a non-empty printable string")

    def types_of(self, path: str) -> tuple[str, ...]:
        if path in self.body_types:
            return self.body_types[path]
        for prefix, types in self.body_types.items():
            if prefix.endswith("/") and path.startswith(prefix):
                return types
        return JSON


def check_exposure(host: str, limits: ServerLimits, what: str) -> None:
    """A server reachable from other machines must have an API key."""
    if host not in LOOPBACK and limits.api_key is None:
        raise ArdeaError(
            f"the {what} binds {host!r}, reachable from other machines: give it an API key "
            "(--api-key, or ServerLimits(api_key=...)) or bind 127.0.0.1"
        )


class Refused(Exception):
    def __init__(self, status: int, message: str, code: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers = headers or {}


ErrorBody = Callable[[int, str, str], dict[str, Any]]


class Guard:
    """The ASGI middleware of the module docstring, around ``app``. ``host``: the address
    the server binds (besides the loopback names, the ``Host`` it answers to; a wildcard
    bind answers to any)."""

    def __init__(self, app: Any, limits: ServerLimits, host: str, error_body: ErrorBody) -> None:
        self.app = app
        self.limits = limits
        self.hosts = None if host in WILDCARD else {*LOOPBACK, host.strip("[]")}
        self.error_body = error_body
        self.in_flight = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            self._check_origin(scope, headers)
            self._check_key(headers)
            encoding = self._check_body_kind(scope, headers)
        except Refused as refused:
            return await self._refuse(send, refused)
        if self.in_flight >= self.limits.max_in_flight:
            message = (f"the server is serving {self.in_flight} requests, its limit "
                       f"max_in_flight={self.limits.max_in_flight}: retry shortly")  # fmt: skip
            return await self._refuse(send, Refused(429, message, "too_many_requests",
                                                    {"retry-after": "1"}))  # fmt: skip
        self.in_flight += 1
        try:
            if scope["method"] in ("POST", "PUT", "PATCH", "DELETE"):
                try:
                    body = await self._body(receive, headers, encoding)
                except Refused as refused:
                    return await self._refuse(send, refused)
                scope = {**scope, "headers": _without(scope["headers"], len(body))}
                receive = _replay(body, receive)
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    # -- the checks ----------------------------------------------------------------------
    def _check_origin(self, scope, headers: dict[str, str]) -> None:
        if scope["method"] == "OPTIONS":
            raise Refused(403, "cross-origin requests are not served (no CORS)", "forbidden")
        host = headers.get("host")
        if host is not None and self.hosts is not None and _hostname(host) not in self.hosts:
            raise Refused(403, f"Host {host!r} is not this server's (served: "
                          f"{', '.join(sorted(self.hosts))})", "forbidden")  # fmt: skip
        origin = headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != host:
            raise Refused(403, f"a request from the web page origin {origin!r} is refused: "
                          "this server is not for browsers", "forbidden")  # fmt: skip
        if headers.get("sec-fetch-site") in ("cross-site", "same-site"):
            raise Refused(403, "a cross-site request from a browser is refused", "forbidden")

    def _check_key(self, headers: dict[str, str]) -> None:
        key = self.limits.api_key
        if key is None:
            return
        given = headers.get("x-api-key")
        if given is None and headers.get("authorization", "").startswith("Bearer "):
            given = headers["authorization"].removeprefix("Bearer ")
        if given is None or not hmac.compare_digest(given.encode(), key.encode()):
            what = "no API key" if given is None else "a wrong API key"
            raise Refused(401, f"the request has {what}: this server was started with "
                          "--api-key (send X-API-Key or Authorization: Bearer)",
                          "invalid_api_key")  # fmt: skip

    def _check_body_kind(self, scope, headers: dict[str, str]) -> str:
        """The body's ``Content-Encoding`` (``identity`` when none), after checking that a
        body comes with a type the route takes."""
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip", "zstd"):
            raise Refused(415, f"Content-Encoding {encoding!r} is not served (gzip, zstd)",
                          "unsupported_encoding")  # fmt: skip
        declared = headers.get("content-type")
        empty = headers.get("content-length", "0") == "0" and "transfer-encoding" not in headers
        if declared is None and empty:
            return encoding
        kind = (declared or "").split(";")[0].strip().lower()
        accepted = self.limits.types_of(scope["path"])
        if kind not in accepted:
            raise Refused(415, f"{scope['method']} {scope['path']} takes Content-Type "
                          f"{' or '.join(accepted)}, got {declared!r}",
                          "unsupported_media_type")  # fmt: skip
        return encoding

    async def _body(self, receive, headers: dict[str, str], encoding: str) -> bytes:
        limit = self.limits.max_body_bytes
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise _too_large(int(length), limit)
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                raise _too_large(len(body), limit)
        if encoding == "identity":
            return bytes(body)
        if len(body) > INLINE_BYTES:
            return await run_in_threadpool(_decompress, bytes(body), encoding, limit)
        return _decompress(bytes(body), encoding, limit)

    async def _refuse(self, send, refused: Refused) -> None:
        payload = json.dumps(self.error_body(refused.status, refused.message, refused.code))
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(payload.encode())).encode())]  # fmt: skip
        headers += [(k.encode(), v.encode()) for k, v in refused.headers.items()]
        await send({"type": "http.response.start", "status": refused.status, "headers": headers})
        await send({"type": "http.response.body", "body": payload.encode()})


def _hostname(host: str) -> str:
    """``Host``'s name without the port (``[::1]:80`` → ``::1``)."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _too_large(size: int, limit: int) -> Refused:
    return Refused(413, f"the request body has {size} bytes or more, over the server's limit "
                   f"of {limit} (max_body_bytes; ardea serve --max-request-mb)",
                   "request_too_large")  # fmt: skip


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` decompressed, reading at most ``limit + 1`` bytes of output."""
    try:
        if encoding == "gzip":
            inflater = zlib.decompressobj(wbits=31)
            out = inflater.decompress(body, limit + 1)
        else:
            reader = _zstandard().ZstdDecompressor().stream_reader(io.BytesIO(body))
            out = reader.read(limit + 1)
    except Refused:
        raise
    except Exception as exc:  # zlib.error, zstandard.ZstdError, a truncated stream
        raise Refused(400, f"the {encoding} body does not decompress: {exc}",
                      "bad_encoding") from None  # fmt: skip
    if len(out) > limit:
        raise Refused(413, f"the {encoding} body of {len(body)} bytes decompresses past the "
                      f"server's limit of {limit} bytes (max_body_bytes)",
                      "request_too_large")  # fmt: skip
    return out


def _zstandard():
    try:
        import zstandard
    except ImportError:  # it comes with the tinker extra, whose SDK sends zstd
        raise Refused(415, "Content-Encoding zstd needs the zstandard package on the server "
                      "(pip install zstandard)", "unsupported_encoding") from None  # fmt: skip
    return zstandard


def _without(headers: list, length: int) -> list:
    """The headers the app sees: no ``Content-Encoding`` (the body is decompressed), the
    body's real length."""
    kept = [(k, v) for k, v in headers if k.lower() not in (b"content-encoding", b"content-length")]
    return [*kept, (b"content-length", str(length).encode())]


def _replay(body: bytes, receive):
    """A ``receive`` that hands the app ``body`` once, then the connection's own events."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed

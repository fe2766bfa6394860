"""Bounded work per request: what a request may cost, from `ServiceSettings`, enforced before the work is done.

- **Headers** (`max_header_bytes`): `BoundedHttpToolsProtocol`, the uvicorn HTTP protocol `perfmodel serve` runs,
  counts the bytes of a request's line and headers as they arrive and answers 431 (and closes) once they pass the
  limit: a 64 MB Authorization header costs the server one read buffer, not 64 MB. (uvicorn's httptools protocol
  has no such limit; its h11 one has `h11_max_incomplete_event_size`, which `perfmodel serve` sets as well.)
- **Bodies** (`LimitsMiddleware`): the limit is that of the route, not of the header a client chose: only
  `POST /v1/jobs` takes multipart/form-data (an ONNX upload, `max_onnx_bytes`); every other body, whatever its
  Content-Type says (a JSON document sent as multipart/mixed), gets `max_request_bytes`. A declared Content-Length
  over the limit is refused before anything is read; a chunked body is cut off at the limit with the same 413.
- **Everything the schemas check against settings** (matrix size, `detail` size, devices, batch, job limits):
  the middleware makes the app's `RequestLimits` current for the request (a context variable), and the pydantic
  validators of `service.schemas` read it with `current_limits()`. Outside a request (tests, the CLI) the defaults
  apply.
- **Big bodies** (`offload_body_bytes`): a request whose declared body is larger than that (a 30 MB IR, a matrix
  of thousands of inline jobs) is read in full by the middleware, then handled by the app on an event loop of its
  own in a worker thread (at most `OFFLOAD_THREADS` at once), its response relayed when complete: parsing and
  validating it never runs on the server's event loop, so other clients keep being answered. (Python's GIL still
  lets a long C-level call, e.g. pydantic validating a whole IR, delay them: see the measured figures in the tests.)
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

try:  # uvicorn[standard] brings httptools; without it `perfmodel serve` runs h11 with its own header limit
    # (re-exported: `perfmodel serve` falls back to h11 when it is None)
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as HttpToolsProtocol
except ImportError:  # pragma: no cover
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

from perfmodel.jobs.limits import JobLimits

MULTIPART_SLACK_BYTES = 64 * 1024  # form fields and boundaries around the uploaded file
# (method, path) -> the multipart type the route takes; every other body is limited as JSON
MULTIPART_ROUTES = {("POST", "/v1/jobs"): b"multipart/form-data"}
OFFLOAD_THREADS = 2  # big bodies handled at once, each in a thread of its own (more wait for one to be free)

@dataclass(frozen=True)
class RequestLimits:
    """The limits the request schemas check (a view of `ServiceSettings`)."""

    job: JobLimits = field(default_factory=JobLimits)
    max_matrix_jobs: int = 10_000
    max_matrix_columns: int = 4096
    max_matrix_cells: int = 250_000
    max_detail_cells: int = 10_000
    offload_body_bytes: int = 256 * 1024

    @classmethod
    def from_settings(cls, settings: Any) -> RequestLimits:
        return cls(job=settings.job_limits, max_matrix_jobs=settings.max_matrix_jobs,
                   max_matrix_columns=settings.max_matrix_columns, max_matrix_cells=settings.max_matrix_cells,
                   max_detail_cells=settings.max_detail_cells, offload_body_bytes=settings.offload_body_bytes)


_DEFAULT_LIMITS = RequestLimits()
_current: contextvars.ContextVar[RequestLimits] = contextvars.ContextVar("perfmodel_request_limits")


def current_limits() -> RequestLimits:
    """The limits of the request being handled (the defaults outside one)."""
    return _current.get(_DEFAULT_LIMITS)


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int):
        super().__init__(413, f"request body larger than {limit} bytes")


class LimitsMiddleware:
    """Makes the app's `RequestLimits` current and holds each body to its route's size limit."""

    def __init__(self, app: ASGIApp, settings: Any) -> None:
        self.app = app
        self.limits = RequestLimits.from_settings(settings)
        self.max_request_bytes: int = settings.max_request_bytes
        self.max_multipart_bytes: int = settings.max_onnx_bytes + MULTIPART_SLACK_BYTES
        self.offload_body_bytes: int = settings.offload_body_bytes
        self._offload_threads: anyio.CapacityLimiter | None = None  # made on the server's loop, when first needed

    def body_limit(self, scope: Scope) -> int:
        multipart = MULTIPART_ROUTES.get((scope["method"], scope["path"].rstrip("/") or "/"))
        if multipart is not None:
            for name, value in scope["headers"]:
                if name == b"content-type" and value.lower().startswith(multipart):
                    return self.max_multipart_bytes
        return self.max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = _current.set(self.limits)
        try:
            await self._limited(scope, receive, send)
        finally:
            _current.reset(token)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.body_limit(scope)
        declared = next((value for name, value in scope["headers"] if name == b"content-length"), None)
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await _reply(send, 400, b'{"detail":"Content-Length is not a number"}')
                return
            if length > limit:
                await _reply(send, 413, b'{"detail":"request body larger than %d bytes"}' % limit)
                return
            if length > self.offload_body_bytes and limit == self.max_request_bytes:
                await self._offloaded(scope, receive, send, limit)
                return
            await self.app(scope, receive, send)  # the server holds the client to its Content-Length
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counted, send)


    async def _offloaded(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """Read the whole body here, run the app on it in a worker thread's own event loop, relay the response."""
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            received += len(chunks[-1])
            if received > limit:
                await _reply(send, 413, b'{"detail":"request body larger than %d bytes"}' % limit)
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        chunks.clear()
        replies: list[Message] = []
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if delivered:
                return {"type": "http.disconnect"}
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def collect(message: Message) -> None:
            replies.append(message)

        async def handle() -> None:
            token = _current.set(self.limits)
            try:
                await self.app(scope, replay, collect)
            finally:
                _current.reset(token)

        if self._offload_threads is None:
            self._offload_threads = anyio.CapacityLimiter(OFFLOAD_THREADS)
        try:
            await anyio.to_thread.run_sync(anyio.run, handle, limiter=self._offload_threads)
        finally:
            for message in replies:  # what the app answered (also when it raised after answering: a 500)
                await send(message)


async def _reply(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


# --- headers -----------------------------------------------------------------------------------------------------

_HEADERS_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                      b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


class BoundedHttpToolsProtocol(HttpToolsProtocol or object):  # type: ignore[misc]
    """uvicorn's httptools protocol with a limit on the bytes of a request line and its headers: past
    `max_header_bytes` (set by `perfmodel serve`; else `ServiceSettings().max_header_bytes`) the client gets 431
    and the connection is closed, before the rest is read."""

    max_header_bytes: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if type(self).max_header_bytes is None:
            from service.settings import ServiceSettings

            type(self).max_header_bytes = ServiceSettings().max_header_bytes
        self._header_limit: int = type(self).max_header_bytes or 0
        self._awaiting_headers = True
        self._header_bytes = 0

    def data_received(self, data: bytes) -> None:
        if self._awaiting_headers:
            self._header_bytes += len(data)
        super().data_received(data)
        if self._awaiting_headers and self._header_bytes > self._header_limit and not self.transport.is_closing():
            body = b'{"detail":"request headers larger than %d bytes"}' % self._header_limit
            self.transport.write(_HEADERS_TOO_LARGE % (len(body), body))
            self.transport.close()

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._awaiting_headers = True
        self._header_bytes = 0

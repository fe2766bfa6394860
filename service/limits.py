"""Request-size limits, as a plain ASGI middleware: multipart bodies (ONNX uploads) may reach `max_onnx_bytes`,
every other body `max_request_bytes`. A declared Content-Length over the limit is refused before anything is
read; a body that grows past it while streaming (chunked) is cut off with the same 413."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException

MULTIPART_SLACK_BYTES = 64 * 1024  # form fields and boundaries around the uploaded file


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int):
        super().__init__(413, f"request body larger than {limit} bytes")


class BodyLimitMiddleware:
    def __init__(self, app: Any, max_request_bytes: int, max_multipart_bytes: int) -> None:
        self.app = app
        self.max_request_bytes = max_request_bytes
        self.max_multipart_bytes = max_multipart_bytes + MULTIPART_SLACK_BYTES

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_request_bytes
        declared = None
        for name, value in scope["headers"]:
            if name == b"content-type" and value.lower().startswith(b"multipart/"):
                limit = self.max_multipart_bytes
            elif name == b"content-length":
                declared = value
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await _reply(send, 400, b'{"detail":"Content-Length is not a number"}')
                return
            if length > limit:
                await _reply(send, 413, b'{"detail":"request body larger than %d bytes"}' % limit)
                return
            await self.app(scope, receive, send)  # the server holds the client to its Content-Length
            return
        received = 0

        async def counted() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counted, send)


async def _reply(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})

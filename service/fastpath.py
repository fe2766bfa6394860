"""The scheduler's hot path: `POST /v1/predict` of a job in memory, asked again or asked anew.

A scheduler polls the same (job, placement) pairs over and over, and a searching one asks placements nobody asked.
Once the app answered a body with 200, the answer is kept, encoded, under (`PredictionEngine.response_token(job)`,
the body's bytes); the token changes whenever anything the answer depends on changes (the serving model, the job's
observations), so a kept answer is never stale. A request whose body was answered before is then served from memory
by this plain ASGI layer, after the same read-access check the router makes, without FastAPI's routing, dependency
solving and body validation: the body is byte-identical to one that passed them.

A new body of a registered job in memory is answered here too when everything it needs is in memory
(`PredictionEngine.predict_cached`: array arithmetic): validated by the same pydantic model the route declares
(`PredictRequest`), answered and kept as the route would. Anything else (another path, a body that does not validate
or is refused, a job or device compute not in memory, a large body) goes to the app unchanged, which answers it
(the 4xx with the field at fault, or the blocking work in a worker thread).
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from perfmodel.core.errors import PerfmodelError
from service.deps import read_allowed
from service.routers.common import encode_json
from service.schemas import PredictRequest

PATH = "/v1/predict"
MAX_BODY_BYTES = 4096  # a (job id, placement) body is ~100-300 bytes; anything bigger takes the normal path


class PredictFastPath:
    def __init__(self, app: ASGIApp, owner: Any) -> None:
        self.app = app
        self.owner = owner  # the FastAPI app: its `state.service` is set by the lifespan
        self.route: Any = None  # the router's route for PATH, as it set it on the first request it handled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        state = getattr(self.owner.state, "service", None)
        length = _header(scope, b"content-length")
        if state is None or length is None or not length.isdigit() or int(length) > MAX_BODY_BYTES:
            await self.app(scope, receive, send)
            return
        body, messages = await _read_body(receive)
        key = _key(state, body) if body is not None else None
        if key is not None and read_allowed(state.settings, _text(_header(scope, b"authorization"))):
            hit = state.responses.get(key)
            if hit is None and self.route is not None and body is not None:
                hit = _answer(state, body)
                if hit is not None:
                    state.responses.offer(key, hit)
            if hit is not None:
                encoded, calibrated = hit
                scope["route"] = self.route  # what the metrics label the request by, as the router would
                state.metrics.count_predictions("predict", 1, int(calibrated))
                await _send_json(send, encoded)
                return
        await self.app(scope, _replay(messages, receive), _keeping(send, state, key) if key is not None else send)
        self.route = self.route or scope.get("route")


def _header(scope: Scope, name: bytes) -> bytes | None:
    for header, value in scope["headers"]:
        if header == name:
            return bytes(value)
    return None


def _text(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value is not None else None


async def _read_body(receive: Receive) -> tuple[bytes | None, list[Message]]:
    """The whole body (None if the client went away or sent more than announced) and the messages read."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return None, messages
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None, messages
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), messages


def _key(state: Any, body: bytes) -> tuple[Any, bytes] | None:
    try:
        job = orjson.loads(body).get("job")
    except (ValueError, AttributeError):  # orjson.JSONDecodeError is a ValueError
        return None
    token = state.engine.response_token(job) if isinstance(job, str) else None
    return (token, body) if token is not None else None


def _answer(state: Any, body: bytes) -> tuple[bytes, bool] | None:
    """The route's answer to a new body when it is only arithmetic on what is in memory, else None (the app
    answers: a body that does not validate, a refusal, work that blocks)."""
    try:
        request = PredictRequest.model_validate_json(body)
        data = state.engine.predict_cached(request.job, request.placement)
    except (ValidationError, PerfmodelError):
        return None
    return None if data is None else (encode_json(data), bool(data["calibrated"]))


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


def _keeping(send: Send, state: Any, key: tuple[Any, bytes]) -> Send:
    """`send`, keeping a 200 JSON answer (one body message) under `key`."""
    status = 0

    async def sending(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body" and status == 200 and not message.get("more_body", False):
            encoded = bytes(message.get("body", b""))
            calibrated = b'"calibrated":true' in encoded
            state.responses.offer(key, (encoded, calibrated))
        await send(message)

    return sending


async def _send_json(send: Send, encoded: bytes) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(encoded)).encode())]})
    await send({"type": "http.response.body", "body": encoded})

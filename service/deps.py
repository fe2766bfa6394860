"""Typed dependencies of the routers: the process's `PredictionEngine` (once the request's access is checked), its
metrics, and bearer-token checks. Tokens are compared by their SHA-256 digest in constant time; the settings never
hold a token in clear."""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from perfmodel.engine import PredictionEngine
from service.errors import ApiError
from service.metrics import Metrics
from service.settings import ServiceSettings
from service.state import ServiceState

bearer = HTTPBearer(auto_error=False, description="a token whose SHA-256 is in PERFMODEL_TOKEN_SHA256 "
                                                  "(writes) or PERFMODEL_READ_TOKEN_SHA256 (reads)")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


async def get_state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


async def get_engine(request: Request) -> PredictionEngine:
    state: ServiceState = request.app.state.service
    return state.engine


async def get_metrics(request: Request) -> Metrics:
    state: ServiceState = request.app.state.service
    return state.metrics


State = Annotated[ServiceState, Depends(get_state)]
Engine = Annotated[PredictionEngine, Depends(get_engine)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


def _matches(credentials: HTTPAuthorizationCredentials | None, digests: tuple[str, ...]) -> bool:
    return credentials is not None and token_matches(credentials.credentials, digests)


def token_matches(token: str, digests: tuple[str, ...]) -> bool:
    """Whether the token's SHA-256 is one of `digests`, in constant time."""
    given = hashlib.sha256(token.encode()).hexdigest()
    found = False
    for digest in digests:  # every digest is compared: the time does not tell which one matched
        found |= hmac.compare_digest(given, digest)
    return found


def _unauthorized(why: str) -> ApiError:
    return ApiError(401, why, headers={"WWW-Authenticate": "Bearer"})


async def require_write(request: Request, credentials: Credentials) -> PredictionEngine:
    """The engine, for a request that writes: it needs a write token unless none is configured."""
    state: ServiceState = request.app.state.service
    if not state.settings.writes_open and not _matches(credentials, state.settings.token_sha256):
        raise _unauthorized("this request writes: it needs a bearer token with write access")
    return state.engine


async def require_read(request: Request, credentials: Credentials) -> PredictionEngine:
    """The engine, for a request that reads: open unless PERFMODEL_READ_REQUIRES_TOKEN."""
    state: ServiceState = request.app.state.service
    settings = state.settings
    if settings.read_requires_token and not _matches(credentials, settings.token_sha256 + settings.read_token_sha256):
        raise _unauthorized("reads need a bearer token on this server")
    return state.engine


def read_allowed(settings: ServiceSettings, authorization: str | None) -> bool:
    """`require_read`'s check on a raw Authorization header (for the ASGI fast path, which has no `Request`)."""
    if not settings.read_requires_token:
        return True
    scheme, _, token = (authorization or "").partition(" ")
    digests = settings.token_sha256 + settings.read_token_sha256
    return scheme.lower() == "bearer" and bool(token.strip()) and token_matches(token.strip(), digests)


# what an endpoint takes: the engine, once the request's access is checked (one dependency per request)
Reader = Annotated[PredictionEngine, Depends(require_read)]
Writer = Annotated[PredictionEngine, Depends(require_write)]

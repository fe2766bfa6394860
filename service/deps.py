"""Typed dependencies of the routers: the process's `ServiceState` (store, predictor, job cache) and bearer-token
checks. Tokens are compared by their SHA-256 digest in constant time; the settings never hold a token in clear."""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.errors import ApiError
from service.state import ServiceState

bearer = HTTPBearer(auto_error=False, description="a token whose SHA-256 is in PERFMODEL_TOKEN_SHA256 "
                                                  "(writes) or PERFMODEL_READ_TOKEN_SHA256 (reads)")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


async def get_state(request: Request) -> ServiceState:
    return request.app.state.service


State = Annotated[ServiceState, Depends(get_state)]


def _matches(credentials: HTTPAuthorizationCredentials | None, digests: tuple[str, ...]) -> bool:
    if credentials is None:
        return False
    given = hashlib.sha256(credentials.credentials.encode()).hexdigest()
    found = False
    for digest in digests:  # every digest is compared: the time does not tell which one matched
        found |= hmac.compare_digest(given, digest)
    return found


def _unauthorized(why: str) -> ApiError:
    return ApiError(401, why, headers={"WWW-Authenticate": "Bearer"})


async def require_write(request: Request, credentials: Credentials) -> ServiceState:
    """The state, for a request that writes: it needs a write token unless none is configured."""
    state: ServiceState = request.app.state.service
    if not state.settings.writes_open and not _matches(credentials, state.settings.token_sha256):
        raise _unauthorized("this request writes: it needs a bearer token with write access")
    return state


async def require_read(request: Request, credentials: Credentials) -> ServiceState:
    """The state, for a request that reads: open unless PERFMODEL_READ_REQUIRES_TOKEN."""
    state: ServiceState = request.app.state.service
    settings = state.settings
    if settings.read_requires_token and not _matches(credentials, settings.token_sha256 + settings.read_token_sha256):
        raise _unauthorized("reads need a bearer token on this server")
    return state


# what an endpoint takes: the process's state, once the request's access is checked (one dependency per request)
Reader = Annotated[ServiceState, Depends(require_read)]
Writer = Annotated[ServiceState, Depends(require_write)]

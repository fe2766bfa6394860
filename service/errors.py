"""Errors the API answers with, and the handlers that turn them (and bad input anywhere) into 4xx responses.

Validation errors are 422 with FastAPI's shape, `{"detail": [{"loc": [...], "msg": ..., "type": ...}]}`, where
`loc` names the field; a `PerfmodelError` (bad input found past validation: an unknown accelerator, a graph that
cannot be captured) is a 422 too. The engine's domain errors map by kind: `FieldError` 422 at its `loc` (under
"body"), `NotFound` 404, `Refused` 409. The request's input is never echoed back (an IR can be megabytes).

A store that cannot be reached or refuses writes for now (PostgreSQL restarting or gone, a connection cut, the pool
exhausted, a read-only or full database, a locked SQLite file) is a 503 with `Retry-After`: the client tries again
later (a write that failed before its commit was not stored; registering a job again is harmless, the same spec
being the same job). Any other database error stays a 500 (a bug, logged with its traceback).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from perfmodel.core.errors import PerfmodelError
from perfmodel.engine.errors import FieldError, Refused
from perfmodel.engine.errors import NotFound as EngineNotFound

log = logging.getLogger("perfmodel.service")

STORE_RETRY_AFTER_S = 2  # what a 503 for an unavailable store tells the client to wait
READ_ONLY_SQLSTATE = "25006"  # PostgreSQL's read_only_sql_transaction: a read-only database (standby, or set so)


class ApiError(Exception):
    """An HTTP error with a JSON `detail` (a message, or a list of FastAPI-style validation errors)."""

    def __init__(self, status_code: int, detail: str | list[dict[str, Any]], headers: dict[str, str] | None = None):
        super().__init__(detail if isinstance(detail, str) else detail[0].get("msg", ""))
        self.status_code = status_code
        self.detail = detail
        self.headers = headers


class NotFound(ApiError):
    def __init__(self, message: str):
        super().__init__(404, message)


def field_error(loc: list[Any], message: str, status_code: int = 422) -> ApiError:
    """A 422 about one field (extended by the field the message itself names first)."""
    loc, message = with_field(list(loc), message)
    return ApiError(status_code, [{"loc": loc, "msg": message, "type": "value_error"}])


# loc segments that are pydantic's names for validators and union members, not fields the client wrote
_INTERNAL_LOC = re.compile(r"[\[\]()]|^constrained-|^job_(id|spec)$")
# where a parameter outside the body is: the segment after it is the parameter's name (`job_id` of a path)
_PARAMETER_PLACES = frozenset({"path", "query", "header", "cookie"})


# a message that starts by naming its field: "global_batch_size: 3 does not split into ..."
_FIELD_PREFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*): ")


def with_field(loc: list[Any], message: str) -> tuple[list[Any], str]:
    """`loc` extended by the field a message names at its start (pydantic's "Value error, " dropped)."""
    message = " ".join(message.removeprefix("Value error, ").split())
    named = _FIELD_PREFIX.match(message)
    if named:
        parts = [int(p) if p.isdigit() else p for p in named.group(1).split(".")]
        if loc[-len(parts):] != parts:
            loc = [*loc, *parts]
    return loc, message


def clean_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for e in errors:
        given = list(e.get("loc", ()))
        named = 2 if given[:1] and given[0] in _PARAMETER_PLACES else 0  # a parameter's name is never internal
        loc = given[:named] + [part for part in given[named:]
                               if not (isinstance(part, str) and _INTERNAL_LOC.search(part))]
        loc, message = with_field(loc, str(e.get("msg", "")))
        out.append({"loc": loc, "msg": message, "type": str(e.get("type", ""))})
    return out


def store_unavailable(exc: BaseException) -> str | None:
    """Why the store cannot serve this for now, if `exc` says so (the connection or the server, not the request):
    a SQLAlchemy `OperationalError` (server gone or restarting, connection refused or cut, disk full, SQLite
    locked), `InterfaceError`, a connection the pool invalidated, its timeout, or a write to a read-only database.
    None for any other error."""
    if isinstance(exc, DBAPIError) and getattr(exc.orig, "sqlstate", None) == READ_ONLY_SQLSTATE:
        return "it refuses writes (read-only)"
    if isinstance(exc, (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)) or (
            isinstance(exc, DBAPIError) and exc.connection_invalidated):
        return "it cannot be reached or refuses the request"
    return None


async def _store_error(_request: Request, exc: Exception) -> JSONResponse:
    why = store_unavailable(exc)
    if why is None:
        raise exc  # a database error that is not the store's availability: a 500, logged with its traceback
    cause = getattr(exc, "orig", None) or exc  # the driver's error: its message, without the SQL and parameters
    log.warning("store unavailable (%s: %s): %s", type(exc).__name__, type(cause).__name__,
                " ".join(str(cause).split())[:300])
    return JSONResponse({"detail": f"the store is unavailable for now: {why}; retry in {STORE_RETRY_AFTER_S} s"},
                        status_code=503, headers={"Retry-After": str(STORE_RETRY_AFTER_S)})


async def _api_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": clean_errors(list(exc.errors()))}, status_code=422)


async def _perfmodel_error(_request: Request, exc: Exception) -> JSONResponse:
    loc, message = with_field(["body"], str(exc))
    return JSONResponse({"detail": [{"loc": loc, "msg": message, "type": "value_error"}]}, status_code=422)


async def _field_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FieldError)
    errors = [{**e, "loc": ["body", *e.get("loc", ())]} for e in exc.errors]
    return JSONResponse({"detail": clean_errors(errors)}, status_code=422)


async def _not_found(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=404)


async def _refused(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=409)


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(FieldError, _field_error)
    app.add_exception_handler(EngineNotFound, _not_found)
    app.add_exception_handler(Refused, _refused)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(PerfmodelError, _perfmodel_error)
    for store_error in (DBAPIError, DisconnectionError, PoolTimeout):
        app.add_exception_handler(store_error, _store_error)

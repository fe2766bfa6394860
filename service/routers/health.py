"""`/healthz` (the process answers), `/readyz` (a model is loaded and the store answers, and takes writes) and
`/metrics` (Prometheus).

`/readyz` asks the store on every call (a pooled connection, pinged first on PostgreSQL), so it turns not ready when
the store goes away and ready again by itself when it is back. A PostgreSQL store that refuses writes (read-only: a
standby, or `default_transaction_read_only`) is not ready either: registrations and observations would be 503s.
Predictions of jobs in memory are still answered while it is not ready."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from service.deps import Reader, State
from service.routers.common import json_response
from service.schemas import Health
from service.state import ServiceState

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz(state: State) -> Response:
    return json_response({"status": "ok", "model_versions": state.engine.model_versions,
                          "writes": "open" if state.settings.writes_open else "token"})


def _store_answers(state: ServiceState) -> str | None:
    try:
        with state.store.engine.connect() as connection:
            if connection.dialect.name == "postgresql":
                if connection.scalar(text("SELECT current_setting('transaction_read_only')")) == "on":
                    return "store: read-only: it refuses writes"
            else:
                connection.execute(text("SELECT 1"))
    except Exception as exc:  # any failure means: not ready
        return f"store: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    return None


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
async def readyz(state: State) -> Response:
    problem = await run_in_threadpool(_store_answers, state)
    if not state.engine.model_versions:
        problem = "no model loaded"
    if problem:
        return json_response({"status": "not ready", "detail": problem}, status_code=503)
    return json_response({"status": "ready", "model_versions": state.engine.model_versions,
                          "writes": "open" if state.settings.writes_open else "token"})


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}})
async def metrics(_engine: Reader, state: State) -> Response:
    return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

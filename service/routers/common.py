"""What several routers share: resolving a job reference (id or inline spec) to the engine's `JobEntry`, and
answering with JSON already serialised (no second validation of what the service built itself)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from fastapi import Response
from starlette.concurrency import run_in_threadpool

from perfmodel.engine import JobEntry, PredictionEngine
from perfmodel.jobs.spec import JobSpec


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def encode_json(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), default=_default).encode()


def json_response(data: Any, status_code: int = 200) -> Response:
    return Response(encode_json(data), status_code=status_code, media_type="application/json")


async def resolve_job(engine: PredictionEngine, ref: str | JobSpec, where: Sequence[str | int]) -> JobEntry:
    """A job id (registered: from memory, else the store) or an inline spec (its graph captured once and kept in
    memory, not stored); anything that blocks runs in a worker thread."""
    entry = engine.job_cached(ref)
    if entry is not None:
        return entry
    return await run_in_threadpool(engine.job, ref, tuple(where))

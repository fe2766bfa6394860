"""What several routers share: resolving a job reference (id or inline spec) to the process's `JobEntry`, and
answering with JSON already serialised (no second validation of what the service built itself)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from fastapi import Response
from starlette.concurrency import run_in_threadpool

from perfmodel.errors import PerfmodelError
from perfmodel.jobs.spec import JobSpec
from service.errors import field_error
from service.state import JobEntry, ServiceState


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def json_response(data: Any, status_code: int = 200) -> Response:
    return Response(json.dumps(data, separators=(",", ":"), default=_default).encode(), status_code=status_code,
                    media_type="application/json")


async def registered_job(state: ServiceState, job_id: str) -> JobEntry:
    """A registered job by id: from memory, else from the store (in a thread); 404 if there is none."""
    entry = state.cached(job_id)
    if entry is not None and entry.registered:
        return entry
    return await run_in_threadpool(state.load, job_id)


async def resolve_job(state: ServiceState, ref: str | JobSpec, where: Sequence[str | int]) -> JobEntry:
    """A job id or an inline spec; an inline spec's graph is captured once and kept in memory (not stored)."""
    if isinstance(ref, str):
        return await registered_job(state, ref)
    entry = state.cached(ref.key())
    if entry is not None:
        return entry
    try:
        return await run_in_threadpool(state.inline, ref)
    except PerfmodelError as exc:
        raise field_error([*where, "source"], " ".join(str(exc).split())) from None

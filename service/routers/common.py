"""What several routers share: resolving a job reference (id or inline spec) to the engine's `JobEntry`, and
answering with JSON already serialised (no second validation of what the service built itself)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
from fastapi import Response
from starlette.concurrency import run_in_threadpool

from perfmodel.engine import JobEntry, PredictionEngine
from perfmodel.jobs.spec import JobSpec


def _default(value: Any) -> Any:
    if isinstance(value, np.generic):  # a numpy scalar a model returned (orjson writes Python's own)
        return value.item()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def encode_json(data: Any) -> bytes:
    """Compact JSON (datetimes in ISO 8601, non-finite floats as null). Copied to its own size: orjson's bytes keep
    their whole write buffer (~8 KB), and the response cache keeps thousands of answers."""
    try:
        encoded = orjson.dumps(data, default=_default, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # a key that is not a string: the option that writes them (it costs every answer ~1 us)
        encoded = orjson.dumps(data, default=_default, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    return bytes(memoryview(encoded))


def json_response(data: Any, status_code: int = 200) -> Response:
    return Response(encode_json(data), status_code=status_code, media_type="application/json")


async def resolve_job(engine: PredictionEngine, ref: str | JobSpec, where: Sequence[str | int]) -> JobEntry:
    """A job id (registered: from memory, else the store) or an inline spec (its graph captured once and kept in
    memory, not stored); anything that blocks runs in a worker thread."""
    entry = engine.job_cached(ref)
    if entry is not None:
        return entry
    return await run_in_threadpool(engine.job, ref, tuple(where))

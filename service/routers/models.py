"""`/v1/models`: the registry's models and what this server serves; promotion is a hot swap: the new model is
loaded first and only then replaces the old one, so an artifact that fails to load is refused (409) and the old
model keeps serving. Promotions are recorded in the store, which every worker and replica follows (and so do
`perfmodel predict` and `perfmodel retrain`, whose promotions, like `perfmodel models promote`'s, are recorded
there too)."""

from __future__ import annotations

import socket

from fastapi import APIRouter, Request, Response
from fastapi import Path as PathParam
from starlette.concurrency import run_in_threadpool

from perfmodel.core.errors import PerfmodelError
from perfmodel.engine import Refused
from service.deps import Reader, Writer
from service.routers.common import json_response
from service.schemas import ErrorOut, ModelsResponse, PromoteResponse

router = APIRouter(prefix="/v1/models", tags=["models"])
EVENTS_SHOWN = 20


@router.get("", response_model=ModelsResponse, responses={409: {"model": ErrorOut}})
async def models(engine: Reader) -> Response:
    """Every model of the registry, which is promoted (what the store promotes for its role, else the registry's
    promoted.json) and which this server answers with; the store's latest model events (promotions and refusals,
    from the service, `perfmodel models promote`, `train --promote` and `retrain`)."""
    try:
        data = await run_in_threadpool(engine.models, EVENTS_SHOWN)
    except Refused:
        raise
    except PerfmodelError as exc:
        raise Refused(f"the model registry cannot be read: {exc}") from None
    return json_response(data)


@router.post("/{version:path}/promote", response_model=PromoteResponse,
             responses={401: {"model": ErrorOut}, 404: {"model": ErrorOut}, 409: {"model": ErrorOut}})
async def promote(request: Request, engine: Writer,
                  version: str = PathParam(description="NAME/VERSION (or NAME: its newest)",
                                           examples=["xgb-ops/v1"])) -> Response:
    """Load the model, record the promotion in the store (every worker follows it) and serve it without a restart.
    A model that does not load, or whose role this server pins, is refused (409, with the reason) and the old
    model keeps serving. The store's event says who asked: this server's host and the client's address."""
    by = {"by": "service", "host": socket.gethostname(),
          "client": request.client.host if request.client is not None else "unknown"}
    return json_response(await run_in_threadpool(engine.promote, version, by))

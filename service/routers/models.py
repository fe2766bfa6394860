"""`/v1/models`: the registry's models and what this server serves; promotion is a hot swap: the new model is
loaded first and only then replaces the old one, so an artifact that fails to load is refused (409) and the old
model keeps serving."""

from __future__ import annotations

from fastapi import APIRouter, Path as PathParam, Response
from starlette.concurrency import run_in_threadpool

from perfmodel.errors import PerfmodelError
from perfmodel.registry.registry import role_of
from service.deps import Reader, Writer
from service.errors import ApiError
from service.routers.common import json_response
from service.schemas import ErrorOut, ModelsResponse, PromoteResponse

router = APIRouter(prefix="/v1/models", tags=["models"])
EVENTS_SHOWN = 20


@router.get("", response_model=ModelsResponse, responses={409: {"model": ErrorOut}})
async def models(state: Reader) -> Response:
    """Every model of the registry, which is promoted and which this server answers with; the latest promotions."""
    try:
        entries = await run_in_threadpool(state.registry.entries)
    except PerfmodelError as exc:
        raise ApiError(409, f"the model registry cannot be read: {exc}") from None
    events = await run_in_threadpool(state.store.model_events, EVENTS_SHOWN)
    serving = state.predictor.model_versions
    return json_response({
        "serving": serving,
        "models": [{"model": e.ref, "regressor": e.manifest.regressor, "role": role_of(e.manifest.regressor),
                    "promoted": e.promoted, "serving": e.ref in serving.values(),
                    "training_samples": e.manifest.training_samples, "created_at": e.manifest.created_at.isoformat(),
                    "metrics": e.manifest.metrics} for e in entries],
        "events": [{"action": e.action, "model_version": e.model_version, "detail": e.detail,
                    "created_at": e.created_at.isoformat()} for e in events],
    })


@router.post("/{version:path}/promote", response_model=PromoteResponse,
             responses={401: {"model": ErrorOut}, 404: {"model": ErrorOut}, 409: {"model": ErrorOut}})
async def promote(state: Writer, version: str = PathParam(description="NAME/VERSION (or NAME: its newest)",
                                                         examples=["xgb-ops/v1"])) -> Response:
    """Load the model, promote it in the registry and serve it without a restart. A model that does not load is
    refused (409, with the reason) and the old model keeps serving."""
    return json_response(await run_in_threadpool(state.promote, version))

"""`/v1/observations`: what a running job measured on a placement, alone or while sharing its GPUs with another
registered job (`colocated_with`: then it calibrates the job's answers while sharing, never alone). Checked against
physics (no throughput above what the placement's peak FLOP/s allows, none absurdly below the model) and stored with
the uncalibrated prediction; the job's predictions are then calibrated robustly (`perfmodel.calibration`). One
observation can be read back and deleted (the job is recalibrated without it)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Response
from fastapi import Path as PathParam
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from service.deps import Reader, Writer
from service.routers.common import json_response
from service.schemas import CalibrationReport, ErrorOut, ObservationRequest, ObservationResponse

router = APIRouter(prefix="/v1/observations", tags=["observations"])
ObservationId = Annotated[int, PathParam(ge=1, le=2**62, description="an observation_id from POST /v1/observations")]


class StoredObservation(BaseModel):
    id: int
    job_id: str = Field(description="the job's id")
    accelerator: str
    devices: int
    placement: dict[str, Any]
    throughput_samples_per_s: float = Field(description="what the job measured")
    predicted_throughput_samples_per_s: float = Field(description="the uncalibrated prediction when it was stored")
    model_version: str
    created_at: datetime
    colocated_with: str | None = Field(default=None, description="the job that shared the GPUs while this one "
                                                                 "measured; None: alone")
    sharing: str | None = None


class DeletedObservation(BaseModel):
    deleted: StoredObservation
    job_id: str
    calibration: CalibrationReport | None = Field(description="the job's calibration without it")


@router.post("", status_code=201, response_model=ObservationResponse,
             responses={401: {"model": ErrorOut}, 404: {"model": ErrorOut}, 422: {"model": ErrorOut}})
async def observe(body: ObservationRequest, engine: Writer) -> Response:
    """Record the throughput a registered job measured on a placement (422 on `throughput_samples_per_s` if
    physics or the model says it cannot be), alone or, with `colocated_with`, while sharing the placement's GPUs
    with that registered job."""
    data = await run_in_threadpool(engine.observe, body.job, body.placement, body.throughput_samples_per_s,
                                   colocated_with=body.colocated_with, sharing=body.sharing)
    return json_response(data, status_code=201)


@router.get("/{observation_id}", response_model=StoredObservation,
            responses={401: {"model": ErrorOut}, 404: {"model": ErrorOut}})
async def get_observation(observation_id: ObservationId, engine: Reader) -> Response:
    """One stored observation."""
    return json_response(await run_in_threadpool(engine.observation, observation_id))


@router.delete("/{observation_id}", response_model=DeletedObservation,
               responses={401: {"model": ErrorOut}, 404: {"model": ErrorOut}})
async def delete_observation(observation_id: ObservationId, engine: Writer) -> Response:
    """Delete an observation (a wrong report, say): its job is recalibrated without it, in every worker."""
    return json_response(await run_in_threadpool(engine.delete_observation, observation_id))

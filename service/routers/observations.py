"""`/v1/observations`: what a running job measured on a placement. Stored with the uncalibrated prediction; from
then on the job's predictions on that accelerator are calibrated (`GET /v1/jobs/{id}` shows the error before and
after)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from service.deps import Writer
from service.routers.common import json_response, registered_job
from service.schemas import ErrorOut, ObservationRequest, ObservationResponse

router = APIRouter(prefix="/v1/observations", tags=["observations"])


@router.post("", status_code=201, response_model=ObservationResponse,
             responses={401: {"model": ErrorOut}, 404: {"model": ErrorOut}, 422: {"model": ErrorOut}})
async def observe(body: ObservationRequest, state: Writer) -> Response:
    """Record the throughput a registered job measured on a placement."""
    entry = await registered_job(state, body.job)
    placement = state.placement(body.placement, entry.spec.batch_size, ("body", "placement"))
    state.check_ir_batch(entry, placement, ("body", "placement"))
    data = await run_in_threadpool(state.observe, entry, placement, body.throughput_samples_per_s)
    return json_response(data, status_code=201)

"""`/v1/accelerators`: the hardware catalog the service predicts for (spec-sheet figures, aliases)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from perfmodel.hardware.spec import HardwareSpec
from service.deps import Reader
from service.routers.common import json_response

router = APIRouter(prefix="/v1/accelerators", tags=["accelerators"])


@router.get("", response_model=list[HardwareSpec])
async def accelerators(state: Reader) -> Response:
    """Every accelerator a placement may name (by name or alias), with its figures."""
    return json_response([spec.model_dump(mode="json") for spec in state.catalog.values()])

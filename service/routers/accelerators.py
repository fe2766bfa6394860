"""`/v1/accelerators`: the hardware catalog the service predicts for (spec-sheet figures, aliases), and custom
accelerators: `POST` a spec sheet (JSON, or YAML as `application/yaml`; `perfmodel.hardware.custom` says what is
checked) and it is stored in the store, so every replica predicts for it (after its next sync); predictions for it
are flagged `extrapolated`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request, Response
from fastapi import Path as PathParam
from starlette.concurrency import run_in_threadpool

from perfmodel.core.errors import PerfmodelError
from perfmodel.hardware.custom import (
    AcceleratorClash,
    SpecSheetError,
    is_custom,
    parse_spec_sheet,
    spec_sheet_example,
    validate_spec_sheet,
)
from perfmodel.hardware.spec import HardwareSpec
from service.deps import Reader, Writer
from service.errors import ApiError, NotFound, field_error

if TYPE_CHECKING:
    from perfmodel.engine.engine import PredictionEngine
from service.routers.common import json_response
from service.schemas import ErrorOut

router = APIRouter(prefix="/v1/accelerators", tags=["accelerators"])
MAX_SPEC_SHEET_BYTES = 64 * 1024

_SPEC_SHEET_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/HardwareSpec"},
                              "example": spec_sheet_example()},
        "application/yaml": {"schema": {"type": "string"}},
    },
}


@router.get("", response_model=list[HardwareSpec])
async def accelerators(engine: Reader) -> Response:
    """Every accelerator a placement may name (by name or alias), with its figures; custom ones included, each
    entry's `custom` saying whether it is a user's spec sheet (as `GET /v1/accelerators/{id}` does)."""
    return json_response([{**spec.model_dump(mode="json"), "custom": is_custom(spec)}
                          for spec in engine.catalog.values()])


@router.get("/{accelerator_id}", response_model=HardwareSpec,
            responses={404: {"model": ErrorOut}, 422: {"model": ErrorOut}})
async def accelerator(engine: Reader,
                      accelerator_id: str = PathParam(max_length=128, description="catalog name or alias")) -> Response:
    """One accelerator by name or alias (shipped or custom); `custom` says whether it is a user's spec sheet."""
    from perfmodel.core.errors import UnknownNameError
    from perfmodel.hardware.catalog import AmbiguousNameError, get_accelerator

    try:
        spec = get_accelerator(accelerator_id, engine.catalog)
    except AmbiguousNameError as exc:
        raise field_error(["path", "accelerator_id"], str(exc)) from None
    except UnknownNameError as exc:
        stored = await run_in_threadpool(_stored, engine, accelerator_id)  # another replica may just have added it
        if stored is None:  # the catalog's message naming the close names, as a prediction naming it gets
            raise NotFound(str(exc) if exc.close_matches else
                           f"no accelerator {accelerator_id!r} (GET /v1/accelerators lists them)") from None
        spec = stored
    return json_response({**spec.model_dump(mode="json"), "custom": is_custom(spec)})


def _stored(engine: PredictionEngine, name: str) -> HardwareSpec | None:
    """The custom accelerator `name` from the store (the engine's catalog learns it), or None."""
    from perfmodel.hardware.catalog import get_accelerator
    from perfmodel.store.accelerators import custom_accelerators

    if engine.store is None or not hasattr(engine.catalog, "refresh"):
        return None
    engine.catalog.refresh(custom_accelerators(engine.store))
    try:
        return get_accelerator(name, engine.catalog)
    except PerfmodelError:
        return None


@router.post("", status_code=201, response_model=HardwareSpec, openapi_extra={"requestBody": _SPEC_SHEET_BODY},
             responses={200: {"model": HardwareSpec, "description": "stored before with the same figures"},
                        401: {"model": ErrorOut}, 409: {"model": ErrorOut}, 413: {"model": ErrorOut},
                        422: {"model": ErrorOut}})
async def add_accelerator(request: Request, engine: Writer) -> Response:
    """Add a custom accelerator from its spec sheet (HardwareSpec fields; numbers bare in the field's unit or with
    a unit, "3.35 TB/s"). 201 when new, 200 when the same sheet was stored before, 409 when its name or an alias
    is the catalog's (or another custom entry's), 422 naming the field that is wrong or missing."""
    body = await request.body()
    if len(body) > MAX_SPEC_SHEET_BYTES:
        raise ApiError(413, f"a spec sheet is at most {MAX_SPEC_SHEET_BYTES} bytes")
    try:
        data = parse_spec_sheet(body, "the request body")
        spec, created = await run_in_threadpool(_add, engine, data)
    except SpecSheetError as exc:
        raise field_error(["body", *exc.loc], exc.detail) from None
    except AcceleratorClash as exc:
        raise ApiError(409, str(exc)) from None
    return json_response({**spec.model_dump(mode="json"), "custom": True}, status_code=201 if created else 200)


def _add(engine: PredictionEngine, data: dict[str, Any]) -> tuple[HardwareSpec, bool]:
    from perfmodel.hardware.custom import catalog_with
    from perfmodel.store.accelerators import add_accelerator as store_add
    from perfmodel.store.accelerators import custom_accelerators

    if engine.store is None:
        raise PerfmodelError("this server has no store to keep custom accelerators in")
    stored = custom_accelerators(engine.store)
    spec = validate_spec_sheet(data, catalog_with(stored, {k: v for k, v in engine.catalog.items()}))
    record, created = store_add(engine.store, spec)
    if hasattr(engine.catalog, "refresh"):
        engine.catalog.refresh([*stored, record.spec])
    return record.spec, created

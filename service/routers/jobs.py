"""`/v1/jobs`: register a job (a spec as JSON, or an ONNX upload as multipart), read it with its calibration
report, list and delete jobs."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, PositiveInt, ValidationError
from starlette.concurrency import run_in_threadpool

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph
from perfmodel.engine import JobEntry, PredictionEngine
from perfmodel.jobs.spec import DEFAULT_SEQ_LEN, GraphSource, JobSpec, Mode, OptimizerName, Precision
from service.deps import Reader, Writer
from service.errors import field_error
from service.routers.common import json_response
from service.schemas import JOB_ID_PATTERN, ApiJobSpec, ErrorOut, JobDetail, JobList, JobOut
from service.state import growing_heap

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
JobIdPath = Annotated[str, PathParam(pattern=JOB_ID_PATTERN, description="a job id from POST /v1/jobs")]

_ONNX_FORM_SCHEMA = {
    "type": "object",
    "required": ["file", "batch_size"],
    "properties": {
        "file": {"type": "string", "format": "binary",
                 "description": "the .onnx model, or one zip holding it and its external data in one folder"},
        "data": {"type": "array", "items": {"type": "string", "format": "binary"},
                 "description": "the model's external data files (model.onnx.data, written by "
                                "`torch.onnx.export(..., dynamo=True)`), named as the model names them; the size "
                                "limit applies to the model and its data together"},
        "batch_size": {"type": "integer", "minimum": 1,
                       "description": "the batch the model is exported at: one forward/backward pass of one "
                                      "replica (README, \"Batch size\")"},
        "seq_len": {"type": "integer", "minimum": 1, "default": DEFAULT_SEQ_LEN},
        "precision": {"type": "string", "enum": [p.value for p in Precision], "default": "fp32"},
        "optimizer": {"type": "string", "enum": [o.value for o in OptimizerName], "default": "sgd"},
        "mode": {"type": "string", "enum": [m.value for m in Mode], "default": "inference",
                 "description": "train: the forward graph with derived backward and optimizer costs (export with "
                                "optimize=False to keep batch norms)"},
    },
}
_REGISTER_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/ApiJobSpec"}},
        "multipart/form-data": {"schema": _ONNX_FORM_SCHEMA},
    },
}


class OnnxForm(BaseModel):
    """The form fields sent with an ONNX upload."""

    model_config = ConfigDict(extra="forbid")

    batch_size: PositiveInt
    seq_len: PositiveInt = DEFAULT_SEQ_LEN
    precision: Precision = Precision.fp32
    optimizer: OptimizerName = OptimizerName.sgd
    mode: Mode = Mode.inference


def job_out(entry: JobEntry, created: bool) -> dict[str, Any]:
    spec, totals = entry.spec, entry.graph.totals
    return {
        "job_id": entry.key, "name": spec.name, "created": created, "source_kind": spec.source.kind,
        "batch_size": spec.batch_size, "seq_len": spec.seq_len, "precision": spec.precision.value,
        "optimizer": spec.optimizer.value, "fused_optimizer": spec.fused_optimizer, "mode": spec.mode.value,
        "channels_last": spec.channels_last,
        "pytorch_version": spec.pytorch_version, "steps_vary": spec.steps_vary,
        "created_at": entry.created_at,
        "graph": {"name": entry.graph.name, "source": entry.graph.source, "mode": entry.graph.mode,
                  "nodes": totals.nodes, "params": totals.params, "flops_fwd": totals.flops_fwd,
                  "flops_bwd": totals.flops_bwd, "activation_bytes": totals.activation_bytes},
    }


def _body_errors(exc: ValidationError) -> RequestValidationError:
    return RequestValidationError([{**e, "loc": ("body", *e["loc"])}
                                   for e in exc.errors(include_url=False, include_input=False, include_context=False)])


@router.post("", status_code=201, response_model=JobOut, openapi_extra={
    "requestBody": _REGISTER_BODY}, responses={200: {"model": JobOut, "description": "registered before: same id"},
                                                401: {"model": ErrorOut}, 413: {"model": ErrorOut},
                                                422: {"model": ErrorOut}})
async def register_job(request: Request, engine: Writer) -> Response:
    """Register a job: a job spec as JSON (zoo name, HF config, or the graph IR of `perfmodel graph --json`), or
    an ONNX model uploaded as multipart with its run settings. Its graph is captured once and kept; the same spec
    registered again returns the same id (200 instead of 201). An IR whose inputs were captured at another batch
    than `batch_size` is refused (422 on `batch_size`)."""
    with growing_heap():  # its IR, graphs and computes are long-lived
        if request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
            spec, graph = await _onnx_job(request)
        else:
            try:
                spec = ApiJobSpec.model_validate_json(await request.body())
            except ValidationError as exc:
                raise _body_errors(exc) from None
            graph = None
        entry, created = await run_in_threadpool(engine.register, spec, graph)
    return json_response(job_out(entry, created), status_code=201 if created else 200)


async def _onnx_job(request: Request) -> tuple[JobSpec, Graph]:
    from perfmodel.graph.onnx_upload import MAX_DATA_FILES, UploadError, uploaded_files

    form = await request.form(max_files=1 + MAX_DATA_FILES, max_fields=8)
    try:
        files = uploaded_files(list(form.multi_items()))
    except UploadError as exc:
        raise field_error(["body", exc.field], exc.detail) from None
    if not any(f.field == "file" for f in files):
        raise field_error(["body", "file"], "an ONNX model file is required (multipart field `file`)")
    try:
        options = OnnxForm.model_validate({k: v for k, v in form.items() if isinstance(v, str)})
    except ValidationError as exc:
        raise _body_errors(exc) from None
    max_total_bytes = request.app.state.service.settings.max_onnx_bytes
    graph = await run_in_threadpool(_graph_of_upload, files, options, max_total_bytes)
    spec = JobSpec(source=GraphSource(graph=json.loads(graph.to_json())), **options.model_dump())
    return spec, graph


def _graph_of_upload(files: list[Any], options: OnnxForm, max_total_bytes: int) -> Graph:
    """The upload's graph: the model with its external data (parts or one zip, `perfmodel.graph.onnx_upload`,
    the limit on the total) in a private folder, checked with `onnx.checker` and shape-inferred; for mode=train
    with derived backward costs. Nothing in it is run."""
    from perfmodel.graph.onnx_upload import UploadError, UploadTooLarge, graph_of_upload
    from perfmodel.jobs.limits import check_graph
    from service.errors import ApiError
    from service.limits import current_limits

    try:
        graph = graph_of_upload(files, max_total_bytes=max_total_bytes, batch_size=options.batch_size,
                                seq_len=options.seq_len, mode=options.mode.value)
    except UploadTooLarge as exc:
        raise ApiError(413, exc.detail) from None
    except UploadError as exc:
        raise field_error(["body", exc.field], exc.detail) from None
    try:
        check_graph(graph, current_limits().job)  # node count, tensor sizes: PERFMODEL_JOB_LIMITS__*
    except PerfmodelError as exc:
        raise field_error(["body", "file"], " ".join(str(exc).split())) from None
    return graph


@router.get("", response_model=JobList)
async def list_jobs(engine: Reader) -> Response:
    """Every registered job (graph sizes included)."""
    entries = await run_in_threadpool(engine.jobs)
    return json_response({"jobs": [job_out(entry, False) for entry in entries]})


@router.get("/{job_id}", response_model=JobDetail,
            responses={404: {"model": ErrorOut}, 422: {"model": ErrorOut}})
async def get_job(job_id: JobIdPath, engine: Reader) -> Response:
    """A registered job, its graph's size, and what observations did to its error: the MAPE of the uncalibrated
    predictions against what it measured, and of leave-one-out calibrated ones."""
    entry, report = await run_in_threadpool(_job_and_report, engine, job_id)
    spec = entry.spec.model_dump(mode="json")
    if spec["source"]["kind"] == "ir":
        spec["source"] = {"kind": "ir", "graph": "(left out: see `graph`)"}
    return json_response({**job_out(entry, False), "spec": spec, "calibration": report})


@router.delete("/{job_id}", status_code=204,
               responses={401: {"model": ErrorOut}, 404: {"model": ErrorOut}})
async def delete_job(job_id: JobIdPath, engine: Writer) -> Response:
    """Forget a job and its observations."""
    await run_in_threadpool(engine.delete_job, job_id)
    return Response(status_code=204)


def _job_and_report(engine: PredictionEngine, job_id: str) -> tuple[JobEntry, dict[str, Any]]:
    entry = engine.job(job_id)
    return entry, engine.calibration_report(entry)

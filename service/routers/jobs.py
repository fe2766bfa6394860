"""`/v1/jobs`: register a job (a spec as JSON, or an ONNX upload as multipart), read it with its calibration
report, list and delete jobs."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Path as PathParam, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, PositiveInt, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from perfmodel.errors import PerfmodelError
from perfmodel.graph.ir import Graph
from perfmodel.jobs.spec import DEFAULT_SEQ_LEN, GraphSource, JobSpec, Mode, OptimizerName, Precision
from service.deps import Reader, Writer
from service.errors import field_error
from service.routers.common import json_response, registered_job
from service.schemas import JOB_ID_PATTERN, ApiJobSpec, ErrorOut, JobDetail, JobList, JobOut
from service.state import JobEntry

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
JobIdPath = Annotated[str, PathParam(pattern=JOB_ID_PATTERN, description="a job id from POST /v1/jobs")]
COPY_CHUNK_BYTES = 1 << 20

_ONNX_FORM_SCHEMA = {
    "type": "object",
    "required": ["file", "batch_size"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "a self-contained .onnx model"},
        "batch_size": {"type": "integer", "minimum": 1},
        "seq_len": {"type": "integer", "minimum": 1, "default": DEFAULT_SEQ_LEN},
        "precision": {"type": "string", "enum": [p.value for p in Precision], "default": "fp32"},
        "optimizer": {"type": "string", "enum": [o.value for o in OptimizerName], "default": "sgd"},
        "mode": {"type": "string", "enum": ["inference"], "default": "inference",
                 "description": "ONNX graphs are inference graphs"},
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
        "optimizer": spec.optimizer.value, "mode": spec.mode.value, "created_at": entry.created_at,
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
async def register_job(request: Request, state: Writer) -> Response:
    """Register a job: a job spec as JSON (zoo name, HF config, or the graph IR of `perfmodel graph --json`), or
    an ONNX model uploaded as multipart with its run settings. Its graph is captured once and kept; the same spec
    registered again returns the same id (200 instead of 201)."""
    if request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        spec, graph = await _onnx_job(request)
    else:
        try:
            spec = ApiJobSpec.model_validate_json(await request.body())
        except ValidationError as exc:
            raise _body_errors(exc) from None
        graph = None
    try:
        entry, created = await run_in_threadpool(state.register, spec, graph)
    except PerfmodelError as exc:
        raise field_error(["body", "source"], " ".join(str(exc).split())) from None
    return json_response(job_out(entry, created), status_code=201 if created else 200)


async def _onnx_job(request: Request) -> tuple[JobSpec, Graph]:
    form = await request.form(max_files=1, max_fields=8)
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise field_error(["body", "file"], "an ONNX model file is required (multipart field `file`)")
    fields = {k: v for k, v in form.items() if k != "file"}
    if any(not isinstance(v, str) for v in fields.values()):
        raise field_error(["body"], "only `file` may be a file")
    try:
        options = OnnxForm.model_validate(fields)
    except ValidationError as exc:
        raise _body_errors(exc) from None
    if options.mode is not Mode.inference:
        raise field_error(["body", "mode"], "ONNX graphs are inference graphs: mode must be inference")
    graph = await run_in_threadpool(_graph_of_upload, upload, options)
    spec = JobSpec(source=GraphSource(graph=json.loads(graph.to_json())), **options.model_dump())
    return spec, graph


def _graph_of_upload(upload: UploadFile, options: OnnxForm) -> Graph:
    """The upload's graph: written to a private folder, refused if it points at external data, checked with
    `onnx.checker` and shape-inferred (`graph_from_onnx`). Nothing in it is run."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    from perfmodel.graph.from_onnx import graph_from_onnx

    filename = Path(upload.filename or "model.onnx").name
    stem = Path(filename).stem or "model"
    with tempfile.TemporaryDirectory(prefix="perfmodel-upload-") as folder:
        path = Path(folder) / "model.onnx"
        upload.file.seek(0)
        with path.open("wb") as out:
            while chunk := upload.file.read(COPY_CHUNK_BYTES):
                out.write(chunk)
        try:
            model = onnx.load(str(path), load_external_data=False)
            external = any(uses_external_data(t) for t in model.graph.initializer)
        except Exception:
            external = False  # not readable ONNX: graph_from_onnx says so in its own words
        if external:
            raise field_error(["body", "file"], "the model keeps weights in external data files: upload a "
                                                "self-contained .onnx")
        try:
            return graph_from_onnx(path, batch_size=options.batch_size, seq_len=options.seq_len, name=stem)
        except PerfmodelError as exc:
            raise field_error(["body", "file"], " ".join(str(exc).replace(str(path), filename).split())) from None


@router.get("", response_model=JobList)
async def list_jobs(state: Reader) -> Response:
    """Every registered job (graph sizes included)."""
    records = await run_in_threadpool(state.store.jobs)
    out = []
    for record in records:
        entry = state.cached(record.key)
        if entry is None:
            entry = await registered_job(state, record.key)
        out.append(job_out(entry, False))
    return json_response({"jobs": out})


@router.get("/{job_id}", response_model=JobDetail,
            responses={404: {"model": ErrorOut}, 422: {"model": ErrorOut}})
async def get_job(job_id: JobIdPath, state: Reader) -> Response:
    """A registered job, its graph's size, and what observations did to its error: the MAPE of the uncalibrated
    predictions against what it measured, and of leave-one-out calibrated ones."""
    entry = await registered_job(state, job_id)
    report = await run_in_threadpool(state.calibration_report, entry)
    spec = entry.spec.model_dump(mode="json")
    if spec["source"]["kind"] == "ir":
        spec["source"] = {"kind": "ir", "graph": "(left out: see `graph`)"}
    return json_response({**job_out(entry, False), "spec": spec, "calibration": report})


@router.delete("/{job_id}", status_code=204,
               responses={401: {"model": ErrorOut}, 404: {"model": ErrorOut}})
async def delete_job(job_id: JobIdPath, state: Writer) -> Response:
    """Forget a job and its observations."""
    await run_in_threadpool(state.delete, job_id)
    return Response(status_code=204)

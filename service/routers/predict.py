"""`/v1/predict` (one job on one placement) and `/v1/predict/matrix` (jobs × placements, or × accelerator types ×
device counts, in one vectorised call; optionally in Gavel's layout). Predictions are calibrated by what the job
observed on the accelerator (`calibrated`, `calibration_factor`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from perfmodel.core.errors import PerfmodelError
from perfmodel.engine import FieldError, JobEntry, PredictionEngine
from perfmodel.hardware.catalog import get_accelerator
from perfmodel.placement.gavel import grid_layouts, job_type_names
from perfmodel.predictor.predict import Prediction
from service.deps import MetricsDep, Reader, State
from service.errors import ApiError
from service.routers.common import encode_json, json_response, resolve_job
from service.schemas import (
    ColocationRequest,
    ColocationResponse,
    ErrorOut,
    GavelResponse,
    MatrixGrid,
    MatrixRequest,
    MatrixResponse,
    PlacementIn,
    PredictRequest,
    PredictResponse,
)
from service.state import growing_heap

router = APIRouter(prefix="/v1/predict", tags=["predict"])
_ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut}, 422: {"model": ErrorOut}}


@router.post("", response_model=PredictResponse, responses=_ERRORS)
async def predict(body: PredictRequest, engine: Reader, state: State) -> Response:
    """The fields of `perfmodel predict --json` for the job on the placement, calibrated by its observations.
    Answered on the event loop when everything is in memory (a registered job asked again: its encoded answer),
    else in a worker thread (capture, store, model)."""
    token = engine.response_token(body.job)
    key = (token, body.placement) if token is not None else None
    hit = state.responses.get(key) if key is not None else None
    if hit is not None:
        encoded, calibrated = hit
    else:
        engine.hardware(body.placement.accelerator, ("placement", "accelerator"))  # before any capture
        data = engine.predict_cached(body.job, body.placement)
        if data is None:
            with growing_heap():  # a job loaded, a device compute made: long-lived
                data = await run_in_threadpool(engine.predict, body.job, body.placement)
        encoded, calibrated = encode_json(data), bool(data["calibrated"])
        if key is not None:
            state.responses.offer(key, (encoded, calibrated))
    state.metrics.count_predictions("predict", 1, int(calibrated))
    return Response(encoded, media_type="application/json")


@router.post("/matrix", response_model=MatrixResponse | GavelResponse, responses=_ERRORS)
async def predict_matrix(body: MatrixRequest, engine: Reader, metrics: MetricsDep) -> Response:
    """Every job on every placement. `grid` generates the placements: each accelerator × device count,
    consolidated (and with `spread`, one device per node too: by default with the gavel layout only). `layout:
    gavel` answers Gavel's dictionaries."""
    check_accelerators(engine, body)
    entries = [await resolve_job(engine, ref, ("jobs", i)) for i, ref in enumerate(body.jobs)]
    if body.layout == "gavel":
        data, cells = await run_in_threadpool(gavel, engine, entries, body)
        metrics.count_predictions("matrix", cells, 0)
        return json_response(data)
    with growing_heap():  # the computes it made are long-lived
        data, cells, calibrated = await run_in_threadpool(matrix, engine, entries, body)
    metrics.count_predictions("matrix", cells, calibrated)
    return json_response(data)


@router.post("/colocation", response_model=ColocationResponse, responses=_ERRORS)
async def predict_colocation(body: ColocationRequest, engine: Reader, metrics: MetricsDep) -> Response:
    """Two jobs sharing the placement's GPU(s): each one's throughput while they do, its isolated answer beside it,
    and the sharing mode assumed. A pair that does not fit in memory together is a 422 at `jobs`."""
    engine.hardware(body.placement.accelerator, ("placement", "accelerator"))  # before any capture
    entries = [await resolve_job(engine, ref, ("jobs", i)) for i, ref in enumerate(body.jobs)]
    refs = [entry.key if entry.registered else entry.spec for entry in entries]
    data = await run_in_threadpool(engine.colocation, refs, body.placement, body.sharing)
    metrics.count_predictions("colocation", 2, sum(bool(a["calibrated"]) for a in data["isolated"]))
    return json_response(data)


def check_accelerators(engine: PredictionEngine, body: MatrixRequest) -> None:
    """A 422 for an accelerator or worker type of the request the catalog does not name, before any of its jobs is
    captured (a misspelt name costs no graph). The catalog look-ups are cached and in memory: on the event loop."""
    if body.layout == "gavel" and body.grid is not None:
        grid_worker_types(engine, body.grid, body.worker_types or {})
    elif body.grid is not None:
        for i, name in enumerate(body.grid.accelerators):
            _grid_accelerator(engine, name, i)
    else:
        assert body.placements is not None
        accelerators = [engine.hardware(p.accelerator, ("placements", j, "accelerator")).name
                        for j, p in enumerate(body.placements)]
        if body.layout == "gavel":
            placement_worker_types(engine, accelerators, body.worker_types or {})


def _grid_accelerator(engine: PredictionEngine, name: str, i: int) -> Any:
    """The catalog entry of `grid.accelerators[i]`; a 422 there if the catalog does not name it."""
    try:
        return get_accelerator(name, engine.catalog)
    except PerfmodelError as exc:
        raise FieldError(("grid", "accelerators", i), str(exc)) from None


def grid_placements(engine: PredictionEngine, grid: MatrixGrid, spread: bool) -> tuple[list[PlacementIn], list[bool]]:
    """The placements of a grid and whether each is consolidated (as few nodes as possible); with `spread`, one
    device per node too."""
    placements: list[PlacementIn] = []
    consolidated: list[bool] = []
    links = {name: value for name in ("inter_node_bandwidth_gbit_s", "inter_node_latency_us", "intra_node_link")
             if (value := getattr(grid, name)) is not None}
    for i, name in enumerate(grid.accelerators):
        hardware = _grid_accelerator(engine, name, i)
        for count in dict.fromkeys(grid.device_counts):
            if count > 1 and hardware.kind != "gpu":
                continue  # multi-device placements are GPU placements
            for layout, packed in grid_layouts(count, grid.per_node or hardware.node_devices, spread=spread):
                for global_batch in grid.global_batches(count):
                    fields: dict[str, Any] = {**links, "accelerator": hardware.name, "devices_per_node": layout}
                    if global_batch is not None:
                        fields["global_batch_size"] = global_batch
                    placements.append(PlacementIn(**fields))
                    consolidated.append(packed)
    if not placements:
        raise FieldError(("grid",), "the grid holds no placement (multi-device placements need a GPU)")
    return placements, consolidated


def matrix(engine: PredictionEngine, entries: Sequence[JobEntry],
           body: MatrixRequest) -> tuple[dict[str, Any], int, int]:
    """The response, its cell count and how many cells are calibrated. Blocking (computes, calibrations)."""
    if body.grid is not None:
        given, consolidated = grid_placements(engine, body.grid, body.grid_spread)
        where: tuple[str, ...] = ("grid",)
    else:
        assert body.placements is not None
        given = body.placements
        consolidated = [p.nodes == 1 for p in given]
        where = ("placements",)
    accelerators: list[str] = []
    shape = (len(entries), len(given))
    raw_throughput, raw_iteration, communication = np.empty(shape), np.empty(shape), np.empty(shape)
    fits = np.empty(shape, dtype=bool)
    rows: list[list[Prediction]] = [[] for _ in entries]
    by_batch: dict[int, list[int]] = defaultdict(list)  # jobs of one batch size share their placements
    for i, entry in enumerate(entries):
        by_batch[entry.spec.batch_size].append(i)
    groups = []
    for batch_size, members in by_batch.items():
        placements = [engine.placement(p, batch_size, (*where, j)) for j, p in enumerate(given)]
        group = [entries[i] for i in members]
        for entry in group:
            for j, placement in enumerate(placements):
                engine.check_ir_batch(entry, placement, (*where, j))
        groups.append((members, group, placements))
    engine.prefetch([(group, placements) for _, group, placements in groups], where)  # every step in one pass
    for members, group, placements in groups:
        arrays = engine.raw_matrix(group, placements, where)
        accelerators = accelerators or [engine.hardware(p.accelerator, (*where, j, "accelerator")).name
                                        for j, p in enumerate(placements)]
        raw_throughput[members] = arrays["throughput_samples_per_s"]
        raw_iteration[members] = arrays["iter_time_ms"]
        communication[members] = arrays["communication"]
        fits[members] = arrays["fits"]
        if body.detail:
            for i, row in zip(members, engine.raw_predictions(group, placements, where)):
                rows[i] = row
    # calibration: each cell's factor, by the job's own observations there, else the fleet's (1 where none)
    factor = np.ones(shape)
    calibrated = np.zeros(shape, dtype=bool)
    fleet = engine.fleet()
    share = np.divide(communication, raw_iteration, out=np.zeros(shape), where=raw_iteration > 0)
    for i, entry in enumerate(entries):
        calibration = engine.calibration(entry)
        if not calibration.points and not len(fleet):
            continue
        for j, (accelerator, placement) in enumerate(zip(accelerators, given)):
            applied = engine.applied(entry, accelerator, placement.devices, float(share[i, j]), calibration, fleet)
            if applied.throughput_factor > 1 or calibration.points:  # the peak, and the job's own scaling
                full = engine.placement(placement, entry.spec.batch_size, (*where, j))
                applied = engine.within_physics(entry, full, float(raw_throughput[i, j]), applied, calibration)
            factor[i, j] = applied.throughput_factor
            calibrated[i, j] = applied.level != "none"
    throughput = raw_throughput * factor
    counts = (throughput.size, int(calibrated.sum()))
    versions = engine.model_versions
    out: dict[str, Any] = {
        "layout": "matrix", "jobs": [e.key for e in entries],
        "placements": [{"accelerator": accelerator, "devices": p.devices, "nodes": p.nodes, "consolidated": c,
                        "global_batch_size": p.global_batch_size,
                        "placement": p.model_dump(mode="json", exclude_none=True)}
                       for p, c, accelerator in zip(given, consolidated, accelerators)],
        "throughput_samples_per_s": throughput.tolist(), "iter_time_ms": (raw_iteration / factor).tolist(),
        "fits": fits.tolist(), "calibrated": calibrated.tolist(),
        "host_bound": [engine.host_bound(entry, engine.calibration(entry)) for entry in entries],
        "model_versions": versions,
    }
    if body.detail:
        out["predictions"] = [[engine.respond(entry, p, engine.calibration(entry), fleet) for p in row]
                              for entry, row in zip(entries, rows)]
    return out, *counts


def gavel(engine: PredictionEngine, entries: Sequence[JobEntry], body: MatrixRequest) -> tuple[dict[str, Any], int]:
    """Gavel's throughputs file of the request (`perfmodel.engine.gavel`): worker types named by `worker_types`
    (else the catalog names), job types by `job_types` (else "<name> (batch size <b>)"), pairs with `colocation`.
    Blocking. The file and the cells it holds."""
    from perfmodel.engine.gavel import GavelColumn, expand_batches, gavel_throughputs, grid_columns

    if body.grid is not None:
        grid = body.grid
        workers = grid_worker_types(engine, grid, body.worker_types or {})
        columns = grid_columns(engine, workers, grid.device_counts, per_node=grid.per_node,
                               inter_node_gbit_s=grid.inter_node_bandwidth_gbit_s,
                               inter_node_latency_us=grid.inter_node_latency_us,
                               intra_node_link=grid.intra_node_link)
        if not body.grid_spread:
            columns = [c for c in columns if c.consolidated]
    else:
        assert body.placements is not None
        accelerators = [engine.hardware(p.accelerator, ("placements", j, "accelerator")).name
                        for j, p in enumerate(body.placements)]
        by_accelerator = placement_worker_types(engine, accelerators, body.worker_types or {})
        columns = [GavelColumn(by_accelerator.get(name, name), name, p.devices_per_node, p.nodes == 1,
                               p.inter_node_bandwidth_gbit_s, p.inter_node_latency_us)
                   for name, p in zip(accelerators, body.placements)]
    if not columns:
        raise FieldError(("grid",), "the grid holds no placement (multi-device placements need a GPU)")
    job_types = body.job_types or job_type_names([(e.key, e.spec.name, e.spec.batch_size) for e in entries])
    if body.grid is not None and body.grid.batch_sizes is not None:  # the batch axis: each job at each batch
        entries, job_types = expand_batches(engine, entries, job_types, body.grid.batch_sizes)
    calibrated: dict[str, dict[str, str]] = {}
    throughputs = gavel_throughputs(engine, entries, job_types, columns, colocation=body.colocation,
                                    sharing=body.sharing, calibrated=calibrated)
    workers_used = {c.worker_type: c.accelerator for c in columns}
    data = {"layout": "gavel", "throughputs": throughputs, "unit": "steps/s",
            "job_types": {t: e.key for t, e in zip(job_types, entries)}, "worker_types": workers_used,
            "calibrated": calibrated,
            "host_bound": {t: why for t, e in zip(job_types, entries)
                           if (why := engine.host_bound(e, engine.calibration(e))) is not None},
            "model_versions": engine.model_versions}
    return data, len(entries) * len(columns)


def grid_worker_types(engine: PredictionEngine, grid: MatrixGrid, named: dict[str, str]) -> dict[str, str]:
    """{worker type: catalog name} of a grid in Gavel's layout: each grid accelerator is a worker type of its own
    name, on the accelerator `named[name]` if given, else on the one it names. A 422 lists every entry at fault: an
    unknown accelerator (at its `worker_types` entry, or its place in `grid.accelerators`) and a worker type the
    grid does not hold (it would file nothing)."""
    errors: list[dict[str, Any]] = []
    for worker_type in named:
        if worker_type not in grid.accelerators:
            errors.append(_error(("worker_types", worker_type), (
                f"worker type {worker_type!r} is not in grid.accelerators ({', '.join(grid.accelerators)}): a grid "
                f"accelerator is filed under the worker type of its name, so add {worker_type!r} there")))
    workers: dict[str, str] = {}
    for i, name in enumerate(grid.accelerators):
        where = ("worker_types", name) if name in named else ("grid", "accelerators", i)
        resolved = _catalog_name(engine, named.get(name, name), where, errors)
        if resolved is not None:
            workers[name] = resolved
    if errors:
        raise ApiError(422, errors)
    return workers


def placement_worker_types(engine: PredictionEngine, accelerators: Sequence[str],
                           named: dict[str, str]) -> dict[str, str]:
    """{catalog name: worker type} of explicit placements in Gavel's layout (`accelerators`: each placement's
    catalog name); the placements on an accelerator no worker type names are filed under its catalog name. A 422
    lists every `worker_types` entry at fault: an unknown accelerator, one no placement is on, and a second worker
    type for the same accelerator."""
    errors: list[dict[str, Any]] = []
    by_accelerator: dict[str, str] = {}
    for worker_type, accelerator in named.items():
        where = ("worker_types", worker_type)
        name = _catalog_name(engine, accelerator, where, errors)
        if name is None:
            continue
        if name in by_accelerator:
            errors.append(_error(where, f"worker types {by_accelerator[name]!r} and {worker_type!r} both name "
                                        f"{name}: its placements are filed under one worker type"))
        elif name not in accelerators:
            errors.append(_error(where, f"no placement is on {name} ({accelerator!r}): the placements are on "
                                        f"{', '.join(dict.fromkeys(accelerators))}"))
        else:
            by_accelerator[name] = worker_type
    if errors:
        raise ApiError(422, errors)
    return by_accelerator


def _catalog_name(engine: PredictionEngine, name: str, where: tuple[str | int, ...],
                  errors: list[dict[str, Any]]) -> str | None:
    """The catalog name `name` resolves to; None when it is unknown or ambiguous, with the catalog's message (its
    close names) appended to `errors` at `where`."""
    try:
        return str(engine.hardware(name, where).name)
    except FieldError as exc:
        errors.append(_error(where, str(exc)))
        return None


def _error(where: tuple[str | int, ...], message: str) -> dict[str, Any]:
    """A 422 error about the field at `where` in the body (not cleaned: a worker type's name is the client's)."""
    return {"loc": ["body", *where], "msg": message, "type": "value_error"}

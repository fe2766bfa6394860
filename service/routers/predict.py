"""`/v1/predict` (one job on one placement) and `/v1/predict/matrix` (jobs × placements, or × accelerator types ×
device counts, in one vectorised call; optionally in Gavel's layout). Predictions are calibrated by what the job
observed on the accelerator (`calibrated`, `calibration_factor`)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from perfmodel.errors import PerfmodelError
from perfmodel.hardware.catalog import get_accelerator
from perfmodel.predictor.predict import Prediction
from service.deps import Reader
from service.errors import field_error
from service.routers.common import json_response, resolve_job
from service.schemas import (ErrorOut, GavelResponse, MatrixGrid, MatrixRequest, MatrixResponse, PlacementIn,
                             PredictRequest, PredictResponse)
from service.state import JobEntry, ServiceState

router = APIRouter(prefix="/v1/predict", tags=["predict"])
_ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut}, 422: {"model": ErrorOut}}


@router.post("", response_model=PredictResponse, responses=_ERRORS)
async def predict(body: PredictRequest, state: Reader) -> Response:
    """The fields of `perfmodel predict --json` for the job on the placement, calibrated by its observations."""
    entry = await resolve_job(state, body.job, ("body", "job"))
    placement = state.placement(body.placement, entry.spec.batch_size, ("body", "placement"))
    state.check_ir_batch(entry, placement, ("body", "placement"))
    warm = (placement.accelerator, placement.micro_batch_size, state.generation)
    if warm in entry.warm:
        prediction = state.raw_prediction(entry, placement)
    else:  # the first prediction of this job on this accelerator runs the per-device model: not on the loop
        prediction = await run_in_threadpool(state.raw_prediction, entry, placement)
        entry.warm.add(warm)
    data = state.respond(entry, prediction)
    state.metrics.count_predictions("predict", 1, int(data["calibrated"]))
    return json_response(data)


@router.post("/matrix", response_model=MatrixResponse | GavelResponse, responses=_ERRORS)
async def predict_matrix(body: MatrixRequest, state: Reader) -> Response:
    """Every job on every placement. `grid` generates the placements: each accelerator × device count,
    consolidated (and with `spread`, one device per node too). `layout: gavel` answers Gavel's dictionaries."""
    entries = [await resolve_job(state, ref, ("body", "jobs", i)) for i, ref in enumerate(body.jobs)]
    data = await run_in_threadpool(matrix, state, entries, body)
    return json_response(data)


def grid_placements(state: ServiceState, grid: MatrixGrid) -> tuple[list[PlacementIn], list[bool]]:
    """The placements of a grid and whether each is consolidated (as few nodes as possible)."""
    placements: list[PlacementIn] = []
    consolidated: list[bool] = []
    network = {name: value for name in ("inter_node_bandwidth_gbps", "inter_node_latency_us")
               if (value := getattr(grid, name)) is not None}
    for i, name in enumerate(grid.accelerators):
        try:
            hardware = get_accelerator(name, state.catalog)
        except PerfmodelError as exc:
            raise field_error(["body", "grid", "accelerators", i], str(exc)) from None
        for count in dict.fromkeys(grid.device_counts):
            if count > 1 and hardware.kind != "gpu":
                continue  # multi-device placements are GPU placements
            per_node = min(grid.per_node or hardware.node_devices or count, count)
            full, rest = divmod(count, per_node)
            placements.append(PlacementIn(accelerator=hardware.name,
                                          devices_per_node=(per_node,) * full + ((rest,) if rest else ()), **network))
            consolidated.append(True)
            if grid.spread and count > 1 and per_node > 1:
                placements.append(PlacementIn(accelerator=hardware.name, devices_per_node=(1,) * count, **network))
                consolidated.append(False)
    if not placements:
        raise field_error(["body", "grid"], "the grid holds no placement (multi-device placements need a GPU)")
    return placements, consolidated


def matrix(state: ServiceState, entries: Sequence[JobEntry], body: MatrixRequest) -> dict[str, Any]:
    if body.grid is not None:
        given, consolidated = grid_placements(state, body.grid)
        where: tuple[str, ...] = ("body", "grid")
    else:
        assert body.placements is not None
        given = body.placements
        consolidated = [p.nodes == 1 for p in given]
        where = ("body", "placements")
    accelerators: list[str] = []
    shape = (len(entries), len(given))
    raw_throughput, raw_iteration = np.empty(shape), np.empty(shape)
    fits = np.empty(shape, dtype=bool)
    rows: list[list[Prediction]] = [[] for _ in entries]
    by_batch: dict[int, list[int]] = defaultdict(list)  # jobs of one batch size share their placements
    for i, entry in enumerate(entries):
        by_batch[entry.spec.batch_size].append(i)
    for batch_size, members in by_batch.items():
        placements = [state.placement(p, batch_size, (*where, j)) for j, p in enumerate(given)]
        group = [entries[i] for i in members]
        for entry in group:
            for j, placement in enumerate(placements):
                state.check_ir_batch(entry, placement, (*where, j))
        arrays = state.raw_matrix(group, placements, where)
        accelerators = accelerators or [state.predictor.hardware(p.accelerator).name for p in placements]
        raw_throughput[members] = arrays["throughput_samples_per_s"]
        raw_iteration[members] = arrays["iteration_ms"]
        fits[members] = arrays["fits"]
        if body.detail:
            for i, row in zip(members, state.raw_predictions(group, placements, where)):
                rows[i] = row
    # calibration: each job's factor on each column's accelerator (1 where it observed nothing there)
    factor = np.ones(shape)
    calibrated = np.zeros(shape, dtype=bool)
    columns: dict[str, list[int]] = defaultdict(list)
    for j, accelerator in enumerate(accelerators):
        columns[accelerator].append(j)
    for i, entry in enumerate(entries):
        for accelerator, (value, count) in state.factors(entry).items():
            factor[i, columns.get(accelerator, [])] = value
            calibrated[i, columns.get(accelerator, [])] = count > 0
    throughput = raw_throughput * factor
    state.metrics.count_predictions("matrix", throughput.size, int(calibrated.sum()))
    versions = state.predictor.model_versions
    if body.layout == "gavel":
        return gavel(entries, given, accelerators, np.where(fits, throughput, 0.0), consolidated, versions)
    out: dict[str, Any] = {
        "layout": "matrix", "jobs": [e.key for e in entries],
        "placements": [{"accelerator": accelerator, "devices": p.devices, "nodes": p.nodes, "consolidated": c,
                        "placement": p.model_dump(mode="json", exclude_none=True)}
                       for p, c, accelerator in zip(given, consolidated, accelerators)],
        "throughput_samples_per_s": throughput.tolist(), "iteration_time_ms": (raw_iteration / factor).tolist(),
        "fits": fits.tolist(), "calibrated": calibrated.tolist(), "model_versions": versions,
    }
    if body.detail:
        out["predictions"] = [[state.respond(entry, p) for p in row] for entry, row in zip(entries, rows)]
    return out


def gavel(entries: Sequence[JobEntry], placements: Sequence[PlacementIn], accelerators: Sequence[str],
          throughput: np.ndarray, consolidated: Sequence[bool], versions: dict[str, str]) -> dict[str, Any]:
    """Gavel's throughput dictionaries (a job that does not fit a placement gets 0); a job type is "<name> (batch
    size <b>)", with the job id added where two jobs of the request would share one."""
    from perfmodel.placement.gavel import gavel_layout

    names = {e.key: f"{e.spec.name} (batch size {e.spec.batch_size})" for e in entries}
    clashes = Counter(names.values())
    job_types = {key: name if clashes[name] == 1 else f"{name} [{key}]" for key, name in names.items()}
    cells = ((job_types[entry.key], accelerators[j], placement.devices, consolidated[j], throughput[i, j])
             for i, entry in enumerate(entries) for j, placement in enumerate(placements))
    layout = gavel_layout(cells)
    return {"layout": "gavel", **layout, "job_types": {t: key for key, t in job_types.items()},
            "model_versions": versions}

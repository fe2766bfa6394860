"""Gavel's throughputs file for jobs x worker types x scale factors (`perfmodel export gavel`, and the service's
`/v1/predict/matrix` with `layout: gavel`), predicted by the engine: data parallel with each job's batch on every
worker (a global batch of batch x scale factor), on the placements `perfmodel.placement.gavel.grid_layouts` gives
(consolidated per the catalog's node_devices, and one device per server), in steps per second; with `colocation`,
every pair of jobs sharing each placement's GPUs (`PredictionEngine.sharing_input`, `placement.colocation.share`),
each job calibrated by what it reported while sharing (`PredictionEngine.sharing_calibration`).
A job that does not fit gets 0, and so does a pair that does not fit together."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfmodel.calibration.sharing import share_calibrated
from perfmodel.placement.colocation import Sharing
from perfmodel.placement.gavel import Layout, gavel_file, grid_layouts, job_type_key, worker_keys
from perfmodel.placement.spec import IntraNodeLink, Parallelism, PlacementSpec
from perfmodel.predictor.memory import shared_capacity_bytes

if TYPE_CHECKING:
    from perfmodel.engine.engine import JobEntry, PredictionEngine


@dataclass(frozen=True)
class GavelColumn:
    """One placement of the grid: the worker type it is filed under, its accelerator and layout."""

    worker_type: str
    accelerator: str
    layout: Layout
    consolidated: bool
    inter_node_bandwidth_gbit_s: float | None = None
    inter_node_latency_us: float | None = None
    intra_node_link: IntraNodeLink | None = None  # e.g. "host": servers without GPU peer-to-peer (cloud VMs)

    def placement(self, batch_size: int) -> PlacementSpec:
        devices = sum(self.layout)
        links = {name: value for name in ("inter_node_bandwidth_gbit_s", "inter_node_latency_us", "intra_node_link")
                 if (value := getattr(self, name)) is not None}
        return PlacementSpec(accelerator=self.accelerator, devices_per_node=self.layout,
                             global_batch_size=batch_size * devices, parallelism=Parallelism(data=devices), **links)


def grid_columns(engine: PredictionEngine, worker_types: Mapping[str, str], scale_factors: Sequence[int], *,
                 per_node: int | None = None, inter_node_gbit_s: float | None = None,
                 inter_node_latency_us: float | None = None,
                 intra_node_link: IntraNodeLink | None = None) -> list[GavelColumn]:
    """Every worker type ({name: catalog accelerator or alias}) at every scale factor, consolidated and one device
    per server (multi-device placements on GPUs only); `intra_node_link` overrides the catalog's link in every
    server (e.g. "host" for cloud VMs without GPU peer-to-peer)."""
    from perfmodel.hardware.catalog import get_accelerator

    columns = []
    for worker_type, accelerator in worker_types.items():
        hardware = get_accelerator(accelerator, engine.catalog)
        for scale_factor in dict.fromkeys(scale_factors):
            if scale_factor > 1 and hardware.kind != "gpu":
                continue
            columns += [GavelColumn(worker_type, hardware.name, layout, consolidated, inter_node_gbit_s,
                                    inter_node_latency_us, intra_node_link)
                        for layout, consolidated in grid_layouts(scale_factor, per_node or hardware.node_devices)]
    return columns


_BATCH_IN_NAME = re.compile(r"\(batch size \d+\)")


def with_batch(job_type: str, batch_size: int) -> str:
    """A job type's name at another batch: its "(batch size N)" replaced, else one appended (Gavel's pattern)."""
    if _BATCH_IN_NAME.search(job_type):
        return _BATCH_IN_NAME.sub(f"(batch size {batch_size})", job_type)
    return f"{job_type} (batch size {batch_size})"


def expand_batches(engine: PredictionEngine, entries: Sequence[JobEntry], job_types: Sequence[str],
                   batch_sizes: Sequence[int]) -> tuple[list[JobEntry], list[str]]:
    """Each job at each of `batch_sizes` (per worker), as a job type of its own: a goodput scheduler's batch axis in
    one file. Graphs of the new batches come from each job's two captures (`GraphCache`), not new captures."""
    out_entries, out_types = [], []
    for entry, job_type in zip(entries, job_types):
        for batch in dict.fromkeys(batch_sizes):
            out_entries.append(entry if batch == entry.spec.batch_size else
                               engine.job(entry.spec.model_copy(update={"batch_size": batch})))
            out_types.append(with_batch(job_type, batch))
    return out_entries, out_types


def gavel_throughputs(engine: PredictionEngine, entries: Sequence[JobEntry], job_types: Sequence[str],
                      columns: Sequence[GavelColumn], *, colocation: bool = False, sharing: Sharing = "time-slicing",
                      calibrated: dict[str, dict[str, str]] | None = None
                      ) -> dict[str, dict[str, dict[str, float | list[float]]]]:
    """Gavel's file of the engine's jobs (`JobEntry`s, named `job_types`) on `columns`. With `calibrated`, the
    cells observations calibrated are filed there as in the file ({worker type: {job key: calibration level}}):
    Gavel's format itself has no place for it."""
    params = [engine.colocation_params(column.accelerator) for column in columns]
    engine.prefetch([([entry], [column.placement(entry.spec.batch_size) for column in columns]) for entry in entries],
                    ("columns",))  # every job's device steps in one pass (a batch axis: one sweep per job)
    steps = [[0.0] * len(columns) for _ in entries]
    inputs: dict[tuple[int, int], tuple[dict[str, Any], Any]] = {}
    for i, entry in enumerate(entries):
        batch = entry.spec.batch_size
        for j, column in enumerate(columns):
            answer, job = engine.sharing_input(entry, column.placement(batch), params[j].host_share_of_gap)
            inputs[(i, j)] = (answer, job)
            if answer["fits"]:
                steps[i][j] = answer["throughput_samples_per_s"] / batch
            level = answer["calibration"]["level"]
            if calibrated is not None and level != "none":
                for worker in worker_keys(column.worker_type, column.layout, column.consolidated):
                    calibrated.setdefault(worker, {})[job_type_key(job_types[i], sum(column.layout))] = level
    pairs: dict[tuple[int, int, int], tuple[float, float]] | None = None
    if colocation:
        pairs = {}
        factors = {(i, j): engine.sharing_applied(entries[i], answer["accelerator"], sharing).factor
                   for (i, j), (answer, _) in inputs.items()}  # each job's reports while sharing, once per column
        for j in range(len(columns)):
            for i in range(len(entries)):
                for k in range(i, len(entries)):
                    (a, job_a), (b, job_b) = inputs[(i, j)], inputs[(k, j)]
                    capacity = a["memory_capacity_bytes"]
                    fits = a["fits"] and b["fits"] and (capacity is None or a["peak_memory_bytes"]
                                                        + b["peak_memory_bytes"] <= shared_capacity_bytes(capacity, 2))
                    if not fits:
                        pairs[(i, k, j)] = pairs[(k, i, j)] = (0.0, 0.0)
                        continue
                    _, (step_a, step_b) = share_calibrated(job_a, job_b, sharing, params[j],
                                                           (factors[(i, j)], factors[(k, j)]))
                    this = steps[i][j] * job_a.step_ms / step_a
                    other = steps[k][j] * job_b.step_ms / step_b
                    pairs[(i, k, j)], pairs[(k, i, j)] = (this, other), (other, this)
    return gavel_file(job_types, [(c.worker_type, c.layout, c.consolidated) for c in columns], steps, pairs)

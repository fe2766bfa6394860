"""Gavel's throughput matrices for jobs x worker types x scale factors (`perfmodel export gavel`), predicted by the
engine: data parallel with each job's batch on every worker (a global batch of batch x scale factor), on the
placements `perfmodel.placement.gavel.grid_layouts` gives (consolidated per the catalog's node_devices, and spread one
device per node). A job that does not fit a device's memory gets throughput 0. The service builds the same grid on
its vectorised path (service/routers/predict.py) through the same placement.gavel functions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from perfmodel.hardware.catalog import get_accelerator
from perfmodel.placement.gavel import GavelMatrix, gavel_matrices, grid_layouts, job_type_names
from perfmodel.placement.spec import Parallelism, PlacementSpec


def gavel_throughputs(engine: Any, specs: Sequence[Any], accelerators: Sequence[str], scale_factors: Sequence[int],
                      *, inter_node_gbit_s: float | None = None) -> dict[str, GavelMatrix]:
    """{"consolidated": matrix, "spread": matrix} of every JobSpec in `specs` on every accelerator (catalog name or
    alias; the matrices use the catalog name) at every scale factor. `inter_node_gbit_s` None: the catalog's network."""
    columns: list[tuple[str, tuple[int, ...], bool]] = []
    for name in accelerators:
        hardware = get_accelerator(name, engine.catalog)
        for scale_factor in dict.fromkeys(scale_factors):
            columns += [(hardware.name, layout, consolidated)
                        for layout, consolidated in grid_layouts(scale_factor, hardware.node_devices)]
    throughput = []
    for spec in specs:
        row = []
        for worker_type, layout, _ in columns:
            placement = PlacementSpec(accelerator=worker_type, devices_per_node=layout,
                                      global_batch_size=spec.batch_size * sum(layout),
                                      parallelism=Parallelism(data=sum(layout)),
                                      inter_node_bandwidth_gbit_s=inter_node_gbit_s)
            result = engine.prediction(spec, placement)
            row.append(result.throughput_samples_per_s if result.fits else 0.0)
        throughput.append(row)
    job_types = job_type_names([(spec.key(), spec.name, spec.batch_size) for spec in specs])
    return gavel_matrices(job_types, columns, throughput)

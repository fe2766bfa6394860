"""A PlacementSpec from the few numbers a user types (`perfmodel predict`'s options): the devices as nodes x devices
per node (or an uneven layout "4,4,2"), the tensor, pipeline and expert degrees, and data parallelism over whatever
the tensor and pipeline degrees leave. Messages name the CLI option at fault (`--tp`, `--ep`, ...); pydantic names a
field outside its choices (`parallelism.zero_stage`, `intra_node_link`)."""

from __future__ import annotations

from perfmodel.core.errors import PerfmodelError
from perfmodel.placement.spec import Parallelism, PlacementSpec


def parse_layout(devices_per_node: str) -> tuple[int, ...]:
    """"4,4,2" -> (4, 4, 2)."""
    try:
        return tuple(int(n) for n in devices_per_node.split(","))
    except ValueError:
        raise PerfmodelError(
            f"--devices-per-node: expected integers like 4,4,2, got {devices_per_node!r}") from None


def placement_from_options(accelerator: str, global_batch_size: int | None, *, batch_size: int = 1, nodes: int = 1,
                           per_node: int = 1, devices_per_node: str | None = None, tp: int = 1, pp: int = 1,
                           micro_batches: int = 1, zero: int = 0, checkpointing: bool = False,
                           intra_link: str | None = None, ep: int = 1, inter_node_gbit_s: float | None = None,
                           inter_node_latency_us: float = 5.0) -> PlacementSpec:
    """Data parallel over whatever the tensor and pipeline degrees leave. `global_batch_size` None: `batch_size` on
    every data-parallel replica and micro-batch. `inter_node_gbit_s` None: the catalog's network of the accelerator's
    server."""
    layout = parse_layout(devices_per_node) if devices_per_node else (per_node,) * nodes
    devices = sum(layout)
    if devices % (tp * pp):
        raise PerfmodelError(f"--tp {tp} x --pp {pp} does not divide the {devices} devices")
    data = devices // (tp * pp)
    if ep < 1 or data % ep:
        raise PerfmodelError(f"--ep {ep} does not divide the data-parallel degree {data}")
    # validated from what the user typed: pydantic names a --zero or --intra-link outside its choices
    parallelism = Parallelism.model_validate(dict(
        data=data, tensor=tp, pipeline=pp, micro_batches=micro_batches, expert=ep, zero_stage=zero,
        activation_checkpointing=checkpointing))
    if global_batch_size is None:
        global_batch_size = batch_size * data * micro_batches
    return PlacementSpec.model_validate(dict(
        accelerator=accelerator, devices_per_node=layout, intra_node_link=intra_link,
        inter_node_bandwidth_gbit_s=inter_node_gbit_s, inter_node_latency_us=inter_node_latency_us,
        parallelism=parallelism, global_batch_size=global_batch_size))

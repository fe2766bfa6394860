"""A PlacementSpec from the few numbers a user types (`perfmodel predict`'s options): the devices as nodes x devices
per node (or an uneven layout "4,4,2"), the tensor, pipeline and expert degrees, and data parallelism over whatever
the tensor and pipeline degrees leave. Every message names the CLI option at fault (`--tp`, `-b/--batch-size`,
`--zero`, ...): the degrees and the batch are checked here, a value pydantic refuses is named by its option."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from perfmodel.core.errors import PerfmodelError, validation_message
from perfmodel.placement.spec import MAX_REPLICA_BATCH, Parallelism, PlacementSpec

M = TypeVar("M", bound=BaseModel)

# the option of each field the options set (devices_per_node: --per-node or --devices-per-node, whichever was given)
_OPTIONS = {"accelerator": "--accelerator", "intra_node_link": "--intra-link",
            "inter_node_bandwidth_gbit_s": "--inter-node-gbit-s", "inter_node_latency_us": "--inter-node-latency-us",
            "zero_stage": "--zero", "micro_batches": "--micro-batches", "tensor": "--tp", "parallelism.tensor": "--tp",
            "pipeline": "--pp", "expert": "--ep", "global_batch_size": "--global-batch-size"}


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
                           inter_node_latency_us: float = 5.0, gradient_bucket_copy: bool = False) -> PlacementSpec:
    """Data parallel over whatever the tensor and pipeline degrees leave. `global_batch_size` None: `batch_size` on
    every data-parallel replica and micro-batch. `inter_node_gbit_s` None: the catalog's network of the accelerator's
    server."""
    counts = {"--tp": tp, "--pp": pp, "--ep": ep, "--micro-batches": micro_batches}
    if devices_per_node is None:
        counts.update({"--nodes": nodes, "--per-node": per_node})
    if global_batch_size is None:
        counts["-b/--batch-size"] = batch_size
    for option, value in counts.items():
        if value < 1:
            raise PerfmodelError(f"{option} must be >= 1, got {value}")
    layout = parse_layout(devices_per_node) if devices_per_node else (per_node,) * nodes
    devices = sum(layout)
    if devices % (tp * pp):
        raise PerfmodelError(f"--tp {tp} x --pp {pp} does not divide the {devices} devices")
    data = devices // (tp * pp)
    if data % ep:
        raise PerfmodelError(f"--ep {ep} does not divide the data-parallel degree {data}")
    if global_batch_size is None:
        if batch_size * micro_batches > MAX_REPLICA_BATCH:
            times = f" x --micro-batches {micro_batches}" if micro_batches > 1 else ""
            raise PerfmodelError(f"-b/--batch-size {batch_size:,}{times} is over the limit of {MAX_REPLICA_BATCH:,} "
                                 f"samples per replica")
        global_batch_size = batch_size * data * micro_batches
    elif global_batch_size < 1:
        raise PerfmodelError(f"--global-batch-size must be >= 1, got {global_batch_size}")
    elif global_batch_size % (data * micro_batches):
        raise PerfmodelError(f"--global-batch-size {global_batch_size} does not split into {data} data-parallel "
                             f"replica(s) x {micro_batches} micro-batch(es)")
    options = {**_OPTIONS, "devices_per_node": "--devices-per-node" if devices_per_node else "--per-node"}
    # validated from what the user typed: a --zero or --intra-link outside its choices is named by its option
    parallelism = _validated(Parallelism, options, dict(
        data=data, tensor=tp, pipeline=pp, micro_batches=micro_batches, expert=ep, zero_stage=zero,
        activation_checkpointing=checkpointing, gradient_bucket_copy=gradient_bucket_copy))
    return _validated(PlacementSpec, options, dict(
        accelerator=accelerator, devices_per_node=layout, intra_node_link=intra_link,
        inter_node_bandwidth_gbit_s=inter_node_gbit_s, inter_node_latency_us=inter_node_latency_us,
        parallelism=parallelism, global_batch_size=global_batch_size))


def _validated(model: type[M], options: Mapping[str, str], data: dict[str, Any]) -> M:
    """`model` validated from `data`; what pydantic refuses is a PerfmodelError naming the option of each field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise PerfmodelError(validation_message(exc, options)) from None

"""`Profile` <-> table rows. Rows are plain dicts keyed by column name, so the database and Parquet share them."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from perfmodel.jobs.spec import Precision
from perfmodel.profilers.external import UPSTREAM_OP, OpMeasurement
from perfmodel.records import OnnxProfile, OpProfile, Profile

# a row read back: column name -> value (a SQLAlchemy RowMapping, whose keys may also be columns, or a dict)
Row = Mapping[Any, Any]


def _no_nan(value: float, name: str) -> float:
    # SQLite stores a NaN REAL as NULL: refuse it rather than hand back a different profile later
    if value != value:
        raise ValueError(f"cannot store a profile with NaN {name}")
    return value


def _shapes(shapes: tuple[tuple[int, ...], ...]) -> list[list[int]]:
    return [list(shape) for shape in shapes]


def profile_values(profile: Profile) -> dict[str, Any]:
    """The `profiles` columns of a profile (all but `id` and `uid`)."""
    job, env, it, ops, onnx = profile.job, profile.environment, profile.iteration, profile.ops, profile.onnx
    values: dict[str, Any] = {
        "job_key": profile.job_id,
        "job_name": job.name,
        "family": profile.family,
        "source_kind": job.source.kind,
        "batch_size": job.batch_size,
        "seq_len": job.seq_len,
        "precision": job.precision.value,
        "optimizer": job.optimizer.value,
        "mode": job.mode.value,
        "job_json": job.model_dump(mode="json"),
        "device": env.device,
        "device_name": env.device_name,
        "host": env.host,
        "environment_json": env.model_dump(mode="json"),
        "outcome": it.outcome.value if it else None,
        "warmup": it.warmup if it else None,
        "repeats": it.repeats if it else None,
        "iter_batch_size": it.batch_size if it else None,
        "samples_ms": list(it.samples_ms) if it else None,
        "iter_time_ms_median": it.iter_time_ms_median if it else None,
        "iter_time_ms_p10": it.iter_time_ms_p10 if it else None,
        "iter_time_ms_p90": it.iter_time_ms_p90 if it else None,
        "iter_time_ms_mean": it.iter_time_ms_mean if it else None,
        "iter_time_cv": it.iter_time_cv if it else None,
        "throughput_samples_per_s": it.throughput_samples_per_s if it else None,
        "peak_memory_bytes": it.peak_memory_bytes if it else None,
        "error": it.error if it else None,
        "ops_steps": ops.steps if ops else None,
        "ops_iteration_time_ms": ops.iter_time_ms if ops else None,
        "ops_coverage": ops.coverage if ops else None,
        "ops_matched_fraction": ops.matched_fraction if ops else None,
        "onnx_provider": onnx.provider if onnx else None,
        "onnx_runs": onnx.runs if onnx else None,
        "onnx_iteration_time_ms_disabled": onnx.iter_time_ms_disabled if onnx else None,
        "onnx_iteration_time_ms_enabled": onnx.iter_time_ms_enabled if onnx else None,
        "created_at": profile.created_at,
    }
    for name, value in values.items():
        if isinstance(value, float):
            _no_nan(value, name)
    for sample in values["samples_ms"] or ():
        _no_nan(sample, "samples_ms")
    return values


def op_values(ops: OpProfile) -> Iterator[dict[str, Any]]:
    """The `op_records` columns of each op (all but `profile_id`), `position` being its index in `ops.ops`."""
    for position, op in enumerate(ops.ops):
        yield {
            "position": position,
            "seq": op.seq,
            "phase": op.phase,
            "name": op.name,
            "kind": op.kind.value,
            "input_shapes": _shapes(op.input_shapes),
            "self_time_ms": _no_nan(op.self_time_ms, "self_time_ms"),
            "ir_node": op.ir_node,
        }


def onnx_values(onnx: OnnxProfile) -> Iterator[dict[str, Any]]:
    """The `onnx_nodes` columns of each node (all but `profile_id`)."""
    for position, node in enumerate(onnx.nodes):
        yield {
            "position": position,
            "graph_optimization": node.graph_optimization,
            "node_name": node.node_name,
            "op_type": node.op_type,
            "kind": node.kind.value,
            "provider": node.provider,
            "time_ms": _no_nan(node.time_ms, "time_ms"),
            "input_shapes": _shapes(node.input_shapes),
            "output_shapes": _shapes(node.output_shapes),
        }


# the columns of an op / ONNX row that make its record (`OpRecord`, `OnnxNodeRecord`), in the records' field order
OP_FIELDS = ("seq", "phase", "name", "kind", "input_shapes", "self_time_ms", "ir_node")
ONNX_FIELDS = (
    "graph_optimization", "node_name", "op_type", "kind", "provider", "time_ms", "input_shapes", "output_shapes"
)


def decode_json_columns(records: Sequence[dict[str, Any]], names: Iterable[str], what: str) -> None:
    """Decode the JSON texts (None for NULL) of columns `names` of `records` in place, one parse per column: on a
    run's thousands of op rows several times faster than one `json.loads` per cell. A cell holding several JSON
    values ("1, 2") would shift the others: the count is checked, and a mismatch is a `json.JSONDecodeError` naming
    the column and `what` the records are."""
    for name in names:
        texts = [record[name] for record in records]
        values = json.loads("[" + ",".join("null" if text is None else text for text in texts) + "]")
        if not isinstance(values, list) or len(values) != len(texts):
            raise json.JSONDecodeError(f"column {name} of {what} is not one JSON value per row", "", 0)
        for record, value in zip(records, values):
            record[name] = value


def to_profile(row: Row, ops: Sequence[dict[str, Any]], nodes: Sequence[dict[str, Any]]) -> Profile:
    """Rebuild a profile from its `profiles` row and its op and ONNX records (dicts of `OP_FIELDS` and
    `ONNX_FIELDS`, in position order); validates it."""
    iteration = None
    if row["outcome"] is not None:
        iteration = {
            "outcome": row["outcome"],
            "warmup": row["warmup"],
            "repeats": row["repeats"],
            "batch_size": row["iter_batch_size"],
            "samples_ms": row["samples_ms"],
            "iter_time_ms_median": row["iter_time_ms_median"],
            "iter_time_ms_p10": row["iter_time_ms_p10"],
            "iter_time_ms_p90": row["iter_time_ms_p90"],
            "iter_time_ms_mean": row["iter_time_ms_mean"],
            "iter_time_cv": row["iter_time_cv"],
            "throughput_samples_per_s": row["throughput_samples_per_s"],
            "peak_memory_bytes": row["peak_memory_bytes"],
            "error": row["error"],
        }
    op_profile = None
    if row["ops_steps"] is not None:
        op_profile = {
            "steps": row["ops_steps"],
            "iter_time_ms": row["ops_iteration_time_ms"],
            "coverage": row["ops_coverage"],
            "matched_fraction": row["ops_matched_fraction"],
            "ops": ops,
        }
    onnx_profile = None
    if row["onnx_provider"] is not None:
        onnx_profile = {
            "provider": row["onnx_provider"],
            "runs": row["onnx_runs"],
            "iter_time_ms_disabled": row["onnx_iteration_time_ms_disabled"],
            "iter_time_ms_enabled": row["onnx_iteration_time_ms_enabled"],
            "nodes": nodes,
        }
    return Profile.model_validate(
        {
            "job": row["job_json"],
            "job_id": row["job_key"],
            "family": row["family"],
            "environment": row["environment_json"],
            "iteration": iteration,
            "ops": op_profile,
            "onnx": onnx_profile,
            "created_at": row["created_at"],
        }
    )


# --- imported op measurements ---


def measurement_uid(measurement: OpMeasurement) -> str:
    """The identity of a measurement across imports: its source, file, row, op (as upstream names it) and phase
    (hashed to 32 hex)."""
    op = measurement.extra.get(UPSTREAM_OP, measurement.op_name)
    key = "\x1f".join((measurement.source, measurement.source_file, str(measurement.source_row), op,
                       measurement.phase))
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def measurement_values(measurement: OpMeasurement, imported_at: datetime) -> dict[str, Any]:
    """The `op_measurements` columns of a measurement (all but `id`)."""
    values = measurement.model_dump()
    values["uid"] = measurement_uid(measurement)
    values["imported_at"] = imported_at
    return values


# --- whole training jobs measured by public benchmarks ---

WHOLE_JOB_OK = "ok"  # the status of a run that has a throughput


class WholeJobRecord(Protocol):
    """What the `whole_job_measurements` table stores of a run (importers' records have these fields, e.g.
    `perfmodel.importers.lambda_runs.WholeJobRun`); `extra` is everything else, JSON-ready."""

    @property
    def source(self) -> str: ...
    @property
    def source_id(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def gpu_name(self) -> str: ...
    @property
    def accelerator(self) -> str | None: ...
    @property
    def devices(self) -> int: ...
    @property
    def nodes(self) -> int: ...
    @property
    def precision(self) -> str: ...
    @property
    def source_precision(self) -> str: ...
    @property
    def batch_size(self) -> float: ...
    @property
    def global_batch_size(self) -> int: ...
    @property
    def throughput(self) -> float | None: ...
    @property
    def unit(self) -> str | None: ...
    @property
    def status(self) -> str: ...
    @property
    def extra(self) -> Mapping[str, Any]: ...


# a source's name is at most this long (the width of whole_job_measurements.source)
WHOLE_JOB_SOURCE_CHARS = 16


def whole_job_values(record: WholeJobRecord, imported_at: datetime) -> dict[str, Any]:
    """The `whole_job_measurements` columns of a run (all but `id`), checked: a run with status "ok" has a finite
    positive throughput and a unit, a failed one neither; counts and batches are positive; `precision` is a
    `Precision`. A record that is not is a ValueError (NaN would be stored as NULL by SQLite)."""
    def refuse(why: str) -> ValueError:
        return ValueError(f"cannot store whole-job run {record.source}:{record.source_id}: {why}")

    if not record.source or len(record.source) > WHOLE_JOB_SOURCE_CHARS or not record.source_id:
        raise refuse(f"source must be 1 to {WHOLE_JOB_SOURCE_CHARS} characters and source_id not empty")
    try:
        precision = Precision(record.precision).value
    except ValueError:
        raise refuse(f"unknown precision {record.precision!r}") from None
    throughput = record.throughput
    if record.status == WHOLE_JOB_OK:
        if throughput is None or not math.isfinite(throughput) or throughput <= 0 or not record.unit:
            raise refuse(f"a run with status ok needs a finite positive throughput and a unit, got {throughput!r} "
                         f"{record.unit!r}")
    elif not record.status or throughput is not None:
        raise refuse("a failed run needs a status (why it failed) and no throughput")
    if min(record.devices, record.nodes, record.global_batch_size) < 1 or not (
            math.isfinite(record.batch_size) and record.batch_size > 0):
        raise refuse("devices, nodes and batch sizes must be positive")
    return {
        "source": record.source,
        "source_id": record.source_id,
        "model": record.model,
        "gpu_name": record.gpu_name,
        "accelerator": record.accelerator,
        "devices": record.devices,
        "nodes": record.nodes,
        "precision": precision,
        "source_precision": record.source_precision,
        "batch_size": float(record.batch_size),
        "global_batch_size": record.global_batch_size,
        "throughput_items_per_s": throughput,
        "unit": record.unit,
        "status": record.status,
        "extra": dict(record.extra),
        "imported_at": imported_at,
    }

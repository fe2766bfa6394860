"""The store's tables (SQLAlchemy 2.0 typed declarative). One row per profiling run, plus its op and ONNX rows;
and, apart from the runs, op timings imported from public GPU benchmarks (`op_measurements`, schema v2), and the
HTTP service's jobs, observed throughputs and model promotions (`jobs`, `observations`, `model_events`, schema v3),
custom accelerators (`accelerators`, schema v4), the graph IR of each profiled job (`graphs`, schema v5) and whole
training jobs measured by public benchmarks (`whole_job_measurements`, schema v6). Observation ids are never
reused from schema v7 (`observations` is AUTOINCREMENT on SQLite).

Units are in the column names. Times are UTC, stored without a zone and returned zone-aware (`UTCDateTime`), so
SQLite and PostgreSQL behave the same. The full job spec and environment are kept as JSON next to the columns
that are pulled out of them for querying.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class UTCDateTime(TypeDecorator[datetime]):
    """A zone-aware datetime stored as naive UTC; naive values given to it are taken to be UTC already."""

    impl = DateTime(timezone=False)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None or value.tzinfo is None:
            return value
        return value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=timezone.utc)


# JSON columns whose None is SQL NULL rather than the JSON literal null.
_JSON = JSON(none_as_null=True)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: _JSON, list[Any]: _JSON, datetime: UTCDateTime}


class SchemaInfo(Base):
    """A single row: the schema version the tables follow."""

    __tablename__ = "schema_info"
    __table_args__ = (CheckConstraint("id = 1", name="schema_info_single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(Integer)


class ProfileRow(Base):
    """One profiling run of one job on one device (a `Profile`)."""

    __tablename__ = "profiles"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(32), unique=True)  # uuid4 hex: stable across stores (parquet)

    # the job
    job_key: Mapped[str] = mapped_column(String(64), index=True)
    job_name: Mapped[str] = mapped_column(Text)
    family: Mapped[str] = mapped_column(Text)
    source_kind: Mapped[str] = mapped_column(String(32))
    batch_size: Mapped[int] = mapped_column(Integer)
    seq_len: Mapped[int] = mapped_column(Integer)
    precision: Mapped[str] = mapped_column(String(16))
    optimizer: Mapped[str] = mapped_column(String(16))
    mode: Mapped[str] = mapped_column(String(16))
    job_json: Mapped[dict[str, Any]]

    # where it ran
    device: Mapped[str] = mapped_column(String(64))
    device_name: Mapped[str] = mapped_column(Text)
    host: Mapped[str] = mapped_column(Text)
    environment_json: Mapped[dict[str, Any]]

    # iteration stats (all NULL when the run has none)
    outcome: Mapped[str | None] = mapped_column(String(16))
    warmup: Mapped[int | None] = mapped_column(Integer)
    repeats: Mapped[int | None] = mapped_column(Integer)
    iter_batch_size: Mapped[int | None] = mapped_column(Integer)
    samples_ms: Mapped[list[Any] | None]
    iter_time_ms_median: Mapped[float | None] = mapped_column(Double)
    iter_time_ms_p10: Mapped[float | None] = mapped_column(Double)
    iter_time_ms_p90: Mapped[float | None] = mapped_column(Double)
    iter_time_ms_mean: Mapped[float | None] = mapped_column(Double)
    iter_time_cv: Mapped[float | None] = mapped_column(Double)
    throughput_samples_per_s: Mapped[float | None] = mapped_column(Double)
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)

    # per-op profile (all NULL when the run has none)
    ops_steps: Mapped[int | None] = mapped_column(Integer)
    ops_iteration_time_ms: Mapped[float | None] = mapped_column(Double)
    ops_coverage: Mapped[float | None] = mapped_column(Double)
    ops_matched_fraction: Mapped[float | None] = mapped_column(Double)

    # ONNX Runtime profile (all NULL when the run has none)
    onnx_provider: Mapped[str | None] = mapped_column(Text)
    onnx_runs: Mapped[int | None] = mapped_column(Integer)
    onnx_iteration_time_ms_disabled: Mapped[float | None] = mapped_column(Double)
    onnx_iteration_time_ms_enabled: Mapped[float | None] = mapped_column(Double)

    created_at: Mapped[datetime] = mapped_column(index=True)


class OpRecordRow(Base):
    """One aten call of a profiled step; `position` is its index in `OpProfile.ops`."""

    __tablename__ = "op_records"

    profile_id: Mapped[int] = mapped_column(ForeignKey("profiles.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer)
    phase: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(32))
    input_shapes: Mapped[list[Any]]
    self_time_ms: Mapped[float] = mapped_column(Double)
    ir_node: Mapped[str | None] = mapped_column(Text)


class OnnxNodeRow(Base):
    """One ONNX Runtime node of a profiled session; `position` is its index in `OnnxProfile.nodes`."""

    __tablename__ = "onnx_nodes"

    profile_id: Mapped[int] = mapped_column(ForeignKey("profiles.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    graph_optimization: Mapped[str] = mapped_column(String(16))
    node_name: Mapped[str] = mapped_column(Text)
    op_type: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(32))
    provider: Mapped[str] = mapped_column(Text)
    time_ms: Mapped[float] = mapped_column(Double)
    input_shapes: Mapped[list[Any]]
    output_shapes: Mapped[list[Any]]


class OpMeasurementRow(Base):
    """One op measured on one device by a public benchmark (an `OpMeasurement`); see perfmodel.profilers.external
    for the meaning of the shape columns. `uid` identifies the measurement (source, file, row, op, phase), so
    importing a file again adds nothing."""

    __tablename__ = "op_measurements"
    __table_args__ = (
        Index("ix_op_measurements_device_op_class", "device", "op_class"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(32), unique=True)

    source: Mapped[str] = mapped_column(String(16))
    source_file: Mapped[str] = mapped_column(Text)
    source_row: Mapped[int] = mapped_column(Integer)
    device: Mapped[str] = mapped_column(String(64))
    op_class: Mapped[str] = mapped_column(String(32))
    op_name: Mapped[str] = mapped_column(String(64))
    dtype: Mapped[str] = mapped_column(String(16))
    phase: Mapped[str] = mapped_column(String(16))

    batch: Mapped[int | None] = mapped_column(BigInteger)
    m: Mapped[int | None] = mapped_column(BigInteger)
    n: Mapped[int | None] = mapped_column(BigInteger)
    k: Mapped[int | None] = mapped_column(BigInteger)
    hidden: Mapped[int | None] = mapped_column(BigInteger)
    seq_len: Mapped[int | None] = mapped_column(Integer)
    in_channels: Mapped[int | None] = mapped_column(Integer)
    out_channels: Mapped[int | None] = mapped_column(Integer)
    input_height: Mapped[int | None] = mapped_column(Integer)
    input_width: Mapped[int | None] = mapped_column(Integer)
    kernel_height: Mapped[int | None] = mapped_column(Integer)
    kernel_width: Mapped[int | None] = mapped_column(Integer)
    stride_height: Mapped[int | None] = mapped_column(Integer)
    stride_width: Mapped[int | None] = mapped_column(Integer)
    padding_height: Mapped[int | None] = mapped_column(Integer)
    padding_width: Mapped[int | None] = mapped_column(Integer)
    input_size: Mapped[int | None] = mapped_column(Integer)
    kernel_size: Mapped[int | None] = mapped_column(Integer)
    stride: Mapped[int | None] = mapped_column(Integer)
    padding: Mapped[int | None] = mapped_column(Integer)
    message_bytes: Mapped[int | None] = mapped_column(BigInteger)
    world_size: Mapped[int | None] = mapped_column(Integer)
    nodes: Mapped[int | None] = mapped_column(Integer)
    num_tokens: Mapped[int | None] = mapped_column(Integer)
    tensor_parallel: Mapped[int | None] = mapped_column(Integer)

    latency_ms: Mapped[float] = mapped_column(Double)
    extra: Mapped[dict[str, Any]]
    imported_at: Mapped[datetime]


# --- the service's records (schema v3): registered jobs, observed throughputs, model promotions ---


class JobRow(Base):
    """A job registered with the service (`POST /v1/jobs`). `key` is `JobSpec.key()`, the job's public id; the
    graph IR is kept as JSON text, so any worker answers for the job without capturing it again."""

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(Text)
    source_kind: Mapped[str] = mapped_column(String(32))
    spec_json: Mapped[dict[str, Any]]
    graph_json: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]


class ObservationRow(Base):
    """The throughput a running job measured on a placement (`POST /v1/observations`), next to what the service
    predicted for it then (uncalibrated) and with which model. Its `id` is the public `observation_id`, so it is never
    given twice: SQLite's AUTOINCREMENT (schema v7) keeps a deleted row's id from going to the next row (a plain
    INTEGER PRIMARY KEY reuses the highest id once its row is deleted); PostgreSQL's sequences never reuse one."""

    __tablename__ = "observations"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    accelerator: Mapped[str] = mapped_column(String(64))
    devices: Mapped[int] = mapped_column(Integer)
    placement_json: Mapped[dict[str, Any]]
    throughput_samples_per_s: Mapped[float] = mapped_column(Double)
    predicted_throughput_samples_per_s: Mapped[float] = mapped_column(Double)
    model_version: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    # schema v8: the job measured this while sharing its GPUs with the registered job `colocated_with` (its key), in
    # `sharing` mode; both None for a job alone on its placement
    colocated_with: Mapped[str | None] = mapped_column(String(64))
    sharing: Mapped[str | None] = mapped_column(String(16))


class ModelEventRow(Base):
    """A model promotion asked of the service: promoted, or refused (its artifact did not load) with the reason."""

    __tablename__ = "model_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    action: Mapped[str] = mapped_column(String(16))
    model_version: Mapped[str] = mapped_column(Text)
    detail: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]


class AcceleratorRow(Base):
    """A custom accelerator: a user's spec sheet (`perfmodel hw add`, `POST /v1/accelerators`), as the
    `HardwareSpec` JSON it validated to (schema v4)."""

    __tablename__ = "accelerators"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    spec_json: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class GraphRow(Base):
    """The graph IR of a profiled job (`Graph.to_json()`), by job key (`JobSpec.key()`, as `profiles.job_key`): the
    graph its per-op profile was matched against, so training reads it instead of capturing it again (schema v5)."""

    __tablename__ = "graphs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_key: Mapped[str] = mapped_column(String(64), unique=True)
    graph_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]


class WholeJobMeasurementRow(Base):
    """One whole training job run by a public benchmark (perfmodel.importers, e.g. `WholeJobRun` of Lambda's runs):
    what ran, on how many of which GPU, and its throughput as the source logged it (per second, in `unit`: the
    model's own item, not converted to samples), or why it failed (`status`). `accelerator` is the hardware-catalog
    id, NULL where the catalog lacked the GPU at import (`gpu_name` is as the source writes it). (source, source_id)
    identifies the run, so importing again adds nothing (schema v6)."""

    __tablename__ = "whole_job_measurements"
    __table_args__ = (
        UniqueConstraint("source", "source_id", name="uq_whole_job_measurements_source_source_id"),
        Index("ix_whole_job_measurements_model_accelerator", "model", "accelerator"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(16))
    source_id: Mapped[str] = mapped_column(Text)  # the run's identity in its source (Lambda: the run log's path)
    model: Mapped[str] = mapped_column(String(64))  # zoo name
    gpu_name: Mapped[str] = mapped_column(Text)
    accelerator: Mapped[str | None] = mapped_column(String(64))
    devices: Mapped[int] = mapped_column(Integer)
    nodes: Mapped[int] = mapped_column(Integer)
    precision: Mapped[str] = mapped_column(String(16))  # perfmodel's Precision: what ran
    source_precision: Mapped[str] = mapped_column(String(16))  # the source's label
    batch_size: Mapped[float] = mapped_column(Double)  # per device: global / devices (fractional when uneven)
    global_batch_size: Mapped[int] = mapped_column(BigInteger)  # samples per optimizer step, all devices
    throughput_items_per_s: Mapped[float | None] = mapped_column(Double)  # whole job; NULL for a failed run
    unit: Mapped[str | None] = mapped_column(String(32))  # the item, as logged: tokens/s, images/s, ...
    status: Mapped[str] = mapped_column(Text)  # "ok", or why there is no throughput ("out of memory", ...)
    extra: Mapped[dict[str, Any]]
    imported_at: Mapped[datetime]

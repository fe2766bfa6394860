"""Request and response bodies of API v1 (pydantic). Units are in the field names.

A job is given by its id (what `POST /v1/jobs` returned: the spec's content hash) or inline as a job spec. The API
takes three model sources: a zoo name, a Hugging Face config, or the graph IR that `perfmodel graph --json`
printed on the client's machine; module paths and server-side ONNX paths are refused (the server never imports or
runs user code, nor reads files a client names). ONNX models are uploaded to `POST /v1/jobs` as multipart.

A placement is a `PlacementSpec` whose `global_batch_size` may be left out: it then is the job's batch size times
the data-parallel degree times the micro-batches (every replica runs the job's batch in each forward/backward pass;
README, "Batch size"), and without `parallelism` every device is a data-parallel replica.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from perfmodel.core.renamed import upgrade_names
from perfmodel.jobs.limits import JobLimitError, check_graph_nodes, check_spec
from perfmodel.jobs.spec import GraphSource, HFConfigSource, JobSpec, ZooSource
from perfmodel.placement.spec import IntraNodeLink, Parallelism, PlacementSpec, data_parallel
from perfmodel.predictor.predict import Prediction
from service.limits import current_limits

JOB_ID_PATTERN = r"^[0-9a-f]{24}$"
REFUSED_SOURCES = {
    "module": "module sources are a CLI feature: the server never imports or runs user code; send the IR that "
              "`perfmodel graph --module ... --json` prints (source kind 'ir') instead",
    "onnx": "the server reads no file a client names: upload the ONNX model to POST /v1/jobs (multipart)",
}

ApiModelSource = Annotated[Union[ZooSource, HFConfigSource, GraphSource], Field(discriminator="kind")]
_JOB_ID = re.compile(JOB_ID_PATTERN)


def _job_id(value: str) -> str:
    if not _JOB_ID.match(value):
        raise ValueError(f"not a job id: a job id is the 24 lowercase hex characters POST /v1/jobs answered "
                         f"(`job_id`), got {value[:40]!r}")
    return value


JobId = Annotated[str, AfterValidator(_job_id),
                  Field(description="a job id from POST /v1/jobs", examples=["572a996d1292de806bef48d2"],
                        json_schema_extra={"pattern": JOB_ID_PATTERN})]


class _In(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _renamed_fields(cls, data: Any) -> Any:
        """Inputs written before the renames of issue 15 (`perfmodel.core.renamed`) under today's names."""
        return upgrade_names(data)


class ApiJobSpec(JobSpec):
    """A job spec as the API takes it: a zoo name, an HF config or a graph IR, plus how it runs."""

    source: ApiModelSource

    @model_validator(mode="before")
    @classmethod
    def _refuse_user_code(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("source"), dict):
            kind = data["source"].get("kind")
            if isinstance(kind, str) and kind in REFUSED_SOURCES:
                raise ValueError(f"source.kind {kind!r} is refused: {REFUSED_SOURCES[kind]}")
            graph = data["source"].get("graph")
            if kind == "ir" and isinstance(graph, dict) and isinstance(graph.get("nodes"), list):
                try:  # before its nodes are parsed
                    check_graph_nodes(len(graph["nodes"]), current_limits().job, where="source.graph")
                except JobLimitError as exc:
                    raise ValueError(str(exc)) from None
        return data

    @model_validator(mode="after")
    def _within_job_limits(self) -> ApiJobSpec:
        """What a job may be (PERFMODEL_JOB_LIMITS__*): batch, sequence, and an HF config's depth, finite numbers,
        layers, widths and estimated parameters, before anything is built."""
        try:
            check_spec(self, current_limits().job)
        except JobLimitError as exc:
            raise ValueError(str(exc)) from None
        return self

    @model_validator(mode="after")
    def _known_zoo_name(self) -> ApiJobSpec:
        if isinstance(self.source, ZooSource):
            from perfmodel.jobs.zoo import get_entry

            try:
                get_entry(self.source.name)
            except KeyError as exc:  # UnknownNameError: names the closest zoo models
                raise ValueError(f"source.name: {exc}") from None
        return self


def _job_ref_kind(value: Any) -> str:
    return "job_id" if isinstance(value, str) else "job_spec"


JobRef = Annotated[Union[Annotated[JobId, Tag("job_id")], Annotated[ApiJobSpec, Tag("job_spec")]],
                   Discriminator(_job_ref_kind), Field(description="a job id, or a job spec inline")]


class PlacementIn(PlacementSpec):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    """A placement; `global_batch_size` defaults to the job's batch size × the data-parallel degree × the
    micro-batches, and `parallelism` to data parallelism over every device."""

    global_batch_size: int | None = Field(default=None, ge=1, description="samples per iteration (one optimizer "  # type: ignore[assignment]
                                          "step) over all replicas and micro-batches; default: the job's batch_size "
                                          "× parallelism.data × parallelism.micro_batches (README, \"Batch size\")")

    @field_validator("devices_per_node")
    @classmethod
    def _bounded_devices(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        limit = current_limits().job.max_devices
        if len(value) > limit or sum(value) > limit:
            raise ValueError(f"{sum(value):.3g} devices on {len(value):,} nodes is over the limit max_devices = "
                             f"{limit:,}")
        return value

    @field_validator("parallelism")
    @classmethod
    def _bounded_degrees(cls, value: Parallelism) -> Parallelism:
        limit = current_limits().job.max_devices
        for name in ("data", "tensor", "pipeline", "micro_batches", "expert"):
            if getattr(value, name) > limit:
                raise ValueError(f"{name}: {getattr(value, name):.3g} is over the limit max_devices = {limit:,}")
        return value

    @field_validator("global_batch_size")
    @classmethod
    def _bounded_batch(cls, value: int | None) -> int | None:
        limit = current_limits().job.max_global_batch
        if value is not None and value > limit:
            raise ValueError(f"{value:.3g} samples is over the limit max_global_batch = {limit:,}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> PlacementIn:  # the rest is checked in `to_spec`, once the batch is known
        if "parallelism" not in self.model_fields_set:
            self.__dict__["parallelism"] = data_parallel(self.devices)
        return self

    def to_spec(self, batch_size: int) -> PlacementSpec:
        """The full placement for a job of `batch_size` (pydantic ValidationError if inconsistent)."""
        values = {name: getattr(self, name) for name in self.model_fields_set}
        values["parallelism"] = self.parallelism
        if self.global_batch_size is None:
            values["global_batch_size"] = batch_size * self.parallelism.data * self.parallelism.micro_batches
        return PlacementSpec(**values)


# --- jobs ---


class GraphSummary(BaseModel):
    name: str
    source: str
    mode: str
    nodes: int
    params: int
    flops_fwd: int
    flops_bwd: int
    activation_bytes: int


class JobOut(BaseModel):
    job_id: str = Field(description="the job's id: its spec's content hash (the same spec always gets it)")
    name: str
    created: bool = Field(description="false: the job was registered before, this is the same job")
    source_kind: str
    batch_size: int = Field(description="samples in one forward/backward pass of one model replica (README, "
                                        "\"Batch size\")")
    seq_len: int
    precision: str
    optimizer: str
    fused_optimizer: bool = Field(description="its optimizer steps in one fused kernel (torch's fused=True, "
                                              "apex's, DeepSpeed's)")
    mode: str
    channels_last: bool = Field(description="priced in channels-last memory format (no layout transposes around "
                                            "its half-precision convolutions)")
    pytorch_version: str | None = Field(description="the PyTorch (major.minor) it is answered for; null: the newest "
                                                    "software the whole-step stage learned")
    steps_vary: bool | None = Field(description="whether its steps vary, so that data-parallel replicas wait for the "
                                                "slowest (its own, or its zoo model's reference); null: not known")
    created_at: datetime
    graph: GraphSummary


class AcceleratorCalibration(BaseModel):
    accelerator: str
    observations: int
    calibration_factor: float = Field(description="recency-weighted median of observed / predicted throughput "
                                                  "over the points kept (outliers excluded)")


class DeviceCountCalibration(AcceleratorCalibration):
    devices: int = Field(description="a device count whose observations differ from the accelerator's factor")


class ExcludedObservation(BaseModel):
    id: int
    reason: str


class ObservationOut(BaseModel):
    id: int
    accelerator: str
    devices: int
    throughput_samples_per_s: float
    predicted_throughput_samples_per_s: float = Field(description="the current model's uncalibrated prediction")
    calibrated_throughput_samples_per_s: float = Field(
        description="leave-one-out: calibrated by this job's other observations on the accelerator")
    created_at: datetime
    excluded: str | None = Field(default=None, description="why calibration leaves it out (None: used)")


class SharedCalibrationOut(BaseModel):
    accelerator: str
    sharing: Literal["time-slicing", "mps"]
    level: Literal["job"]
    factor: float = Field(description="multiplies the job's throughput while sharing this accelerator in this mode")
    observations: int
    partners: int


class CalibrationReport(BaseModel):
    observations: int
    used: int | None = Field(default=None, description="observations the factors use (the rest are excluded)")
    mape_uncalibrated_pct: float | None = Field(description="MAPE of the uncalibrated predictions vs observed")
    mape_calibrated_pct: float | None = Field(
        description="MAPE of leave-one-out calibrated predictions vs observed (each observation predicted with a "
                    "factor from the job's other observations on its accelerator)")
    by_accelerator: list[AcceleratorCalibration]
    by_device_count: list[DeviceCountCalibration] = Field(default=[], description="device counts with a factor "
                                                          "of their own")
    excluded: list[ExcludedObservation] = Field(default=[], description="observations left out, and why")
    recent: list[ObservationOut] = Field(description="the latest observations, newest first")
    sharing: list[SharedCalibrationOut] = Field(default=[], description="what the job's reports while sharing its "
                                                                        "GPUs calibrate, by accelerator and mode "
                                                                        "(the counts above are of its reports alone)")


class JobDetail(JobOut):
    spec: dict[str, Any] = Field(description="the job spec (an IR source's graph is left out: see `graph`)")
    calibration: CalibrationReport


class JobList(BaseModel):
    jobs: list[JobOut]


# --- predictions ---


class PredictRequest(_In):
    job: JobRef
    placement: PlacementIn


class EvidenceOut(BaseModel):
    observations: int
    jobs: int


class CalibrationApplied(BaseModel):
    level: Literal["job", "accelerator", "chip", "none"] = Field(
        description="the most specific evidence that applied: `job` (this job's observations, on this accelerator "
                    "or, through the fleet, on others), `accelerator` (other jobs observed on it), `chip` (jobs on "
                    "other SKUs of its die), `none`")
    factor: float = Field(description="the factor on throughput (1: none)")
    observations: int = Field(description="observations behind the factor")
    jobs: int = Field(description="distinct jobs behind the factor")
    interval_scale: float = Field(description="the interval's width (log) over the uncalibrated one: below 1 with "
                                              "evidence, above when the observed jobs disagree")
    sources: dict[str, EvidenceOut] = Field(description="the evidence at each level (job, accelerator, chip)")


class PredictResponse(Prediction):
    calibrated: bool = Field(description="true: scaled by observations (this job's, or the fleet's: `calibration`)")
    calibration_factor: float = Field(description="calibrated / uncalibrated throughput; 1 if none")
    observations: int = Field(description="observations behind the factor")
    calibration: CalibrationApplied
    uncalibrated_iter_time_ms: float
    uncalibrated_throughput_samples_per_s: float
    host_bound_likely: bool = Field(default=False, description="true: something the graph does not show on the "
                                    "host likely bounds the step (host_bound_reason), so a faster GPU speeds it up "
                                    "less than the device time says")
    host_bound_reason: str | None = Field(default=None, description="why: the zoo model's reference "
                                          "implementation works on the host, or the job's own reports here put its "
                                          "step over twice the predicted device time")


class MatrixGrid(_In):
    accelerators: list[str] = Field(min_length=1, max_length=64, description="catalog names or aliases")
    device_counts: list[Annotated[int, Field(ge=1, le=4096)]] = Field(default=[1], min_length=1, max_length=16)
    per_node: int | None = Field(default=None, ge=1, le=64, description="devices a node holds: a consolidated "
                                 "placement of n devices fills nodes of this size; default: the catalog's "
                                 "node_devices of the accelerator, else n on one node")
    spread: bool | None = Field(default=None, description="also one device per node for each count > 1 (Gavel's "
                                "unconsolidated placements); default: true with the gavel layout (Gavel looks up "
                                "`<worker type>_unconsolidated` at every scale factor), false otherwise")
    inter_node_bandwidth_gbit_s: float | None = Field(
        default=None, gt=0, description="network of one node over all its NICs, Gb/s (1e9 bit/s, not GB/s); "
                                        "default: each accelerator's node_network_gbit_s in the catalog, else 100")
    inter_node_latency_us: float | None = Field(default=None, ge=0, description="one-way network latency, µs; "
                                                "default: the placement's (5)")
    intra_node_link: IntraNodeLink | None = Field(default=None, description="every node's link instead of the "
                                                  "catalog's; \"host\": no GPU peer-to-peer, transfers staged "
                                                  "through host memory (cloud VMs, NCCL_P2P_DISABLE=1)")
    batch_sizes: list[Annotated[int, Field(ge=1)]] | None = Field(
        default=None, min_length=1, max_length=256, description="a batch axis: every placement at each of these "
                                                                "batch sizes per device (data parallel)")
    global_batch_sizes: list[Annotated[int, Field(ge=1)]] | None = Field(
        default=None, min_length=1, max_length=256, description="a batch axis: every placement at each of these "
                                                                "global batch sizes that its device count divides")

    @model_validator(mode="after")
    def _one_batch_axis(self) -> MatrixGrid:
        if self.batch_sizes is not None and self.global_batch_sizes is not None:
            raise ValueError("give batch_sizes (per device) or global_batch_sizes, not both")
        return self

    def global_batches(self, devices: int) -> list[int | None]:
        """The global batch of each column of a placement of `devices` (None: the job's batch on each device)."""
        if self.batch_sizes is not None:
            return [b * devices for b in dict.fromkeys(self.batch_sizes)]
        if self.global_batch_sizes is not None:
            return [b for b in dict.fromkeys(self.global_batch_sizes) if b % devices == 0]
        return [None]


class MatrixRequest(_In):
    """Jobs × placements. Its size is bounded by the server's settings: rows (`PERFMODEL_MAX_MATRIX_JOBS`, 10,000),
    columns given or generated by `grid` (`PERFMODEL_MAX_MATRIX_COLUMNS`, 1,024), cells (`..._MAX_MATRIX_CELLS`,
    250,000) and cells with `detail` (`..._MAX_DETAIL_CELLS`, 10,000)."""

    jobs: list[JobRef] = Field(min_length=1)
    placements: list[PlacementIn] | None = Field(default=None, min_length=1)
    grid: MatrixGrid | None = Field(default=None, description="instead of `placements`: accelerators × device "
                                                              "counts (multi-device on GPUs only)")
    layout: Literal["matrix", "gavel"] = Field(default="matrix", description="gavel: Gavel's throughput "
                                               "dictionaries, keyed by job type and worker type")
    detail: bool = Field(default=False, description="also every full prediction (matrix layout)")
    job_types: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        default=None, description="gavel layout: each job's job type name (Gavel's, e.g. 'ResNet-50 (batch size "
                                  "64)'); default '<name> (batch size <b>)'")
    worker_types: dict[Annotated[str, Field(min_length=1, max_length=100)], str] | None = Field(
        default=None, max_length=64, description="gavel layout: {worker type: catalog accelerator}. With `grid`, "
                                                 "each worker type is one of grid.accelerators, the entry it names; "
                                                 "with `placements`, the placements on its accelerator are filed "
                                                 "under it (each accelerator a placement's)")
    colocation: bool = Field(default=False, description="gavel layout: also every pair of jobs sharing each "
                                                        "placement's GPUs")
    sharing: Literal["time-slicing", "mps"] = Field(default="time-slicing", description="co-location: "
                                                    "time-slicing (two processes) or CUDA MPS")

    @field_validator("jobs", "placements", mode="before")
    @classmethod
    def _bounded_lists(cls, value: Any, info: Any) -> Any:
        limits = current_limits()
        limit = limits.max_matrix_jobs if info.field_name == "jobs" else limits.max_matrix_columns
        if isinstance(value, list) and len(value) > limit:  # refused before its items are validated
            name = "max_matrix_jobs" if info.field_name == "jobs" else "max_matrix_columns"
            raise ValueError(f"{len(value):,} {info.field_name} is over the limit {name} = {limit:,}")
        return value

    @model_validator(mode="after")
    def _job_types_match(self) -> MatrixRequest:
        if self.job_types is not None and len(self.job_types) != len(self.jobs):
            raise ValueError(f"job_types: {len(self.job_types)} names for {len(self.jobs)} jobs")
        if self.job_types is not None and len(set(self.job_types)) != len(self.job_types):
            raise ValueError("job_types: two jobs share a job type name")
        return self

    @model_validator(mode="after")
    def _one_placement_source(self) -> MatrixRequest:
        if (self.placements is None) == (self.grid is None):
            raise ValueError("placements, grid: give exactly one of them")
        limits = current_limits()
        columns = len(self.placements) if self.placements is not None else grid_columns(self.grid, self.grid_spread)
        if columns > limits.max_matrix_columns:
            raise ValueError(f"grid: expands to {columns:,} placements, over the limit max_matrix_columns = "
                             f"{limits.max_matrix_columns:,}")
        cells = len(self.jobs) * columns
        if cells > limits.max_matrix_cells:
            raise ValueError(f"jobs: {len(self.jobs):,} jobs × {columns:,} placements = {cells:,} cells, over the "
                             f"limit max_matrix_cells = {limits.max_matrix_cells:,}")
        if self.detail and cells > limits.max_detail_cells:
            raise ValueError(f"detail: {cells:,} full predictions are over the limit max_detail_cells = "
                             f"{limits.max_detail_cells:,} (ask without detail, or for fewer cells)")
        return self

    @property
    def grid_spread(self) -> bool:
        """Whether the grid also places one device per node: `grid.spread`, by default with the gavel layout only."""
        if self.grid is None:
            return False
        return self.grid.spread if self.grid.spread is not None else self.layout == "gavel"


def grid_columns(grid: Any, spread: bool) -> int:
    """How many placements a grid generates (as `POST /v1/predict/matrix` expands it, with `spread` as the request
    resolves it): an upper bound from its sizes; exact, from the catalog, only when that bound is over the limit. An
    unknown accelerator counts as a GPU (its error comes later, naming it)."""
    counts = list(dict.fromkeys(grid.device_counts))
    batches = max(len(grid.global_batches(count)) for count in counts)
    bound = len(grid.accelerators) * len(counts) * (2 if spread else 1) * batches
    if bound <= current_limits().max_matrix_columns:
        return bound
    from perfmodel.core.errors import PerfmodelError
    from perfmodel.hardware.catalog import get_accelerator, load_catalog

    catalog = load_catalog()
    columns = 0
    for name in grid.accelerators:
        try:
            hardware = get_accelerator(name, catalog)
            gpu, node_devices = hardware.kind == "gpu", hardware.node_devices
        except PerfmodelError:
            gpu, node_devices = True, None
        for count in counts:
            if count > 1 and not gpu:
                continue
            per_node = min(grid.per_node or node_devices or count, count)
            columns += (1 + bool(spread and count > 1 and per_node > 1)) * len(grid.global_batches(count))
    return columns


class MatrixPlacement(BaseModel):
    accelerator: str
    devices: int
    nodes: int
    global_batch_size: int | None = Field(default=None, description="the column's global batch (grid batch axis)")
    consolidated: bool
    placement: dict[str, Any] = Field(description="the placement as given (global_batch_size per job)")


class MatrixResponse(BaseModel):
    layout: Literal["matrix"] = "matrix"
    jobs: list[str] = Field(description="job ids, one per row")
    placements: list[MatrixPlacement] = Field(description="one per column")
    throughput_samples_per_s: list[list[float]]
    iter_time_ms: list[list[float]]
    fits: list[list[bool | None]]
    calibrated: list[list[bool]]
    host_bound: list[str | None] = Field(default_factory=list, description="one per row: why the job's step is "
                                         "likely bound by its host on any GPU (its zoo model's reference "
                                         "implementation, or its own reports over twice the predicted device "
                                         "time), else null")
    model_versions: dict[str, str]
    predictions: list[list[PredictResponse]] | None = None


class GavelResponse(BaseModel):
    layout: Literal["gavel"] = "gavel"
    throughputs: dict[str, dict[str, dict[str, float | list[float]]]] = Field(
        description="Gavel's throughputs file: {worker type: {\"(JOB_TYPE, SCALE_FACTOR)\": {\"null\": steps/s "
                    "alone, \"(OTHER_JOB_TYPE, SCALE_FACTOR)\": [this, other] steps/s sharing the GPUs}}}; "
                    "`<worker type>_unconsolidated`: one device per server")
    unit: Literal["steps/s"] = "steps/s"
    job_types: dict[str, str] = Field(description="job type -> job id")
    worker_types: dict[str, str] = Field(description="worker type -> catalog accelerator")
    calibrated: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="the cells observations calibrated, keyed as in `throughputs`: {worker "
                                          "type: {\"(JOB_TYPE, SCALE_FACTOR)\": calibration level (job, "
                                          "accelerator, chip)}}; empty when none did")
    host_bound: dict[str, str] = Field(default_factory=dict, description="job type -> why its step is likely "
                                       "bound by its host (its zoo model's reference implementation, or its own "
                                       "reports over twice the predicted device time); the others are not named")
    model_versions: dict[str, str]


# --- co-location ---


class ColocationRequest(_In):
    jobs: list[JobRef] = Field(min_length=2, max_length=2, description="the two jobs sharing the GPU(s)")
    placement: PlacementIn = Field(description="the GPU(s) both jobs run on; each job's global batch follows its "
                                               "own batch unless given")
    sharing: Literal["time-slicing", "mps"] = Field(default="time-slicing", description="time-slicing: two "
                                                    "processes (the default); mps: CUDA MPS, kernels concurrent")


class SharingCalibrationOut(BaseModel):
    level: Literal["job", "none"] = Field(description="job: the job's own reports while sharing; none: the model")
    factor: float = Field(description="multiplies the model's throughput while sharing (capped: never faster than "
                                      "alone, never more work per second than the device)")
    observations: int = Field(description="the job's reports while sharing this accelerator in this mode")
    partners: int = Field(description="the other jobs those reports were made with")


class ColocationResponse(BaseModel):
    jobs: list[str]
    accelerator: str
    devices: int
    sharing: Literal["time-slicing", "mps"]
    throughput_samples_per_s: list[float] = Field(description="each job's throughput while both share the GPU(s)")
    steps_per_s: list[float]
    interval_samples_per_s: list[list[float]] = Field(description="each job's 80 % interval")
    isolated_throughput_samples_per_s: list[float] = Field(description="each job alone (calibrated)")
    slowdown: list[float] = Field(description="each job's step shared over alone (>= 1)")
    device_share: list[float] = Field(description="share of the time each job has work on the device, alone or "
                                                  "sharing it with the other job; time both have work counts "
                                                  "in both, so the two may sum above 1")
    combined_device_share: float = Field(description="what the pair holds of the device, at most 1: each job's "
                                                     "kernel time of a step alone per step while sharing, summed "
                                                     "(under MPS times its sm_fill, or its bandwidth_share, "
                                                     "whichever the pair uses more of)")
    sm_fill: list[float] = Field(description="each job's share of the device's compute units (SMs) its kernels "
                                             "hold while they run, weighted by their time: under MPS, two jobs "
                                             "whose fills (and bandwidth shares) add up to at most 1 run side "
                                             "by side at full speed")
    bandwidth_share: list[float] = Field(description="each job's share of the device's memory bandwidth its kernels "
                                                     "draw while they run (their bytes at the peak bandwidth over "
                                                     "their time)")
    calibration: list[SharingCalibrationOut] = Field(description="for each job, what calibrates its answer while "
                                                                  "sharing: its own reports while sharing this "
                                                                  "accelerator in this mode (POST /v1/observations "
                                                                  "with colocated_with)")
    peak_memory_bytes: list[int]
    memory_capacity_bytes: int | None
    fits: bool
    isolated: list[PredictResponse]
    model_versions: dict[str, str]


# --- observations ---


class ObservationRequest(_In):
    job: JobId
    placement: PlacementIn
    throughput_samples_per_s: float = Field(gt=0, strict=True, description="what the running job measured")
    colocated_with: JobId | None = Field(default=None, description="a registered job that shared the placement's "
                                                                   "GPUs while this one measured: the report then "
                                                                   "calibrates this job's answers while sharing, "
                                                                   "never its answers alone")
    sharing: Literal["time-slicing", "mps"] = Field(default="time-slicing", description="how the two shared the "
                                                    "GPUs (with colocated_with only)")

    @field_validator("job", mode="before")
    @classmethod
    def _registered_job(cls, value: Any) -> Any:
        """A job spec inline (as predictions take) is refused saying what to send instead."""
        if not isinstance(value, str):
            raise ValueError("observations are of a registered job: register it with POST /v1/jobs and pass its "
                             "job_id here")
        return value

    @model_validator(mode="after")
    def _finite(self) -> ObservationRequest:
        if not math.isfinite(self.throughput_samples_per_s):
            raise ValueError("throughput_samples_per_s: must be finite")
        if self.colocated_with is None and "sharing" in self.model_fields_set:
            raise ValueError("sharing: the mode of a report made while sharing the GPUs; give colocated_with (the "
                             "other job's id) too")
        return self


class ObservationResponse(BaseModel):
    observation_id: int
    job_id: str
    accelerator: str
    throughput_samples_per_s: float
    predicted_throughput_samples_per_s: float = Field(description="the uncalibrated prediction for this placement")
    error_pct: float = Field(description="(predicted - observed) / observed × 100, uncalibrated")
    calibrated: bool = Field(description="true: from now on this job's predictions on this accelerator are "
                                         "calibrated with what it observed")
    calibration_factor: float
    observations: int = Field(description="observations of this job on this accelerator")
    excluded: str | None = Field(default=None, description="why calibration leaves this observation out (an "
                                                           "outlier); None: it is used")
    colocated_with: str | None = Field(default=None, description="the job that shared the GPUs (as posted)")
    sharing: Literal["time-slicing", "mps"] | None = None
    message: str


# --- models, accelerators, health ---


class ModelOut(BaseModel):
    model: str = Field(description="NAME/VERSION")
    regressor: str
    role: str
    promoted: bool = Field(description="the registry's promoted model of its role")
    serving: bool = Field(description="this server answers with it now")
    training_samples: int | None
    created_at: datetime
    metrics: dict[str, Any]


class ModelEventOut(BaseModel):
    action: str
    model_version: str
    detail: str | None
    created_at: datetime


class ModelsResponse(BaseModel):
    serving: dict[str, str] = Field(description="role -> NAME/VERSION this server answers with")
    pinned: str | None = Field(default=None, description="NAME/VERSION this server pins for its role "
                                                         "(PERFMODEL_MODEL_VERSION): promotions of that role do not "
                                                         "move it")
    models: list[ModelOut]
    events: list[ModelEventOut] = Field(description="the latest promotions asked of the service, newest first")


class PromoteResponse(BaseModel):
    promoted: str
    serving: dict[str, str]
    previous: dict[str, str]


class Health(BaseModel):
    status: str
    model_versions: dict[str, str] = {}
    writes: Literal["token", "open"] = "token"
    detail: str | None = None


class ErrorOut(BaseModel):
    detail: str | list[dict[str, Any]]

"""What the profilers measured: frozen records shared by the profilers, the store and the CLI.

A `Profile` is one profiling run of one job on one device: its environment, its per-iteration timing and,
optionally, its per-op (torch.profiler) and per-node (ONNX Runtime) timings. The store keeps every run.
"""

from __future__ import annotations

from datetime import datetime, timezone
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfmodel.core.opkinds import OpKind
from perfmodel.core.renamed import upgrade_names
from perfmodel.jobs.spec import JobSpec


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class Environment(_Frozen):
    """Where a profile was taken."""

    device: str  # as requested and resolved: cpu, cuda:0
    device_type: str  # cpu, cuda (ROCm builds report cuda, see `hip_version`)
    device_name: str  # exactly as torch reports it (torch.cuda.get_device_name), or the CPU model on CPU
    device_count: int  # devices of that type on the host
    cpu_model: str
    cpu_cores: int
    threads: int  # torch.get_num_threads() during the run
    host: str
    os: str
    python_version: str
    torch_version: str
    onnxruntime_version: str | None = None
    cuda_version: str | None = None  # torch.version.cuda
    hip_version: str | None = None  # torch.version.hip
    driver_version: str | None = None
    perfmodel_version: str
    captured_at: datetime = Field(default_factory=utc_now)


class Outcome(str, Enum):
    ok = "ok"
    oom = "oom"  # the step ran out of device memory: recorded, not a crash


class IterationStats(_Frozen):
    """Per-iteration timing of the real step (forward, loss, backward, optimizer step; or inference)."""

    outcome: Outcome
    warmup: int  # warm-up steps run (fewer than asked only under profile_job's time budget)
    repeats: int  # timed repeats run (idem); for an oom outcome, the counts asked for
    batch_size: int
    samples_ms: tuple[float, ...] = ()  # every timed repeat, in order
    iter_time_ms_median: float | None = None
    iter_time_ms_p10: float | None = None
    iter_time_ms_p90: float | None = None
    iter_time_ms_mean: float | None = None
    iter_time_cv: float | None = None  # coefficient of variation (std / mean) of the repeats
    throughput_samples_per_s: float | None = None  # batch_size / median
    peak_memory_bytes: int | None = None  # GPU: allocator peak (all tensors); CPU: peak growth of torch's CPU
    # allocator during the step (tensors created in the step: activations, gradients, temporaries; not weights)
    error: str | None = None  # the OOM message when outcome is oom


Phase = Literal["forward", "backward", "optimizer", "other"]


class OpRecord(_Frozen):
    """One aten call in a profiled step (torch.profiler with shapes)."""

    seq: int  # order within the profiled step
    phase: Phase
    name: str  # aten::addmm
    kind: OpKind
    input_shapes: tuple[tuple[int, ...], ...] = ()
    self_time_ms: float  # time in this call itself (device time on GPU, CPU time on CPU), children excluded
    ir_node: str | None = None  # the IR node this call implements, where it could be matched


class OpProfile(_Frozen):
    """The per-op view of one step: every top-level aten call, and how much of the step they explain."""

    steps: int  # profiled steps the op times are averaged over
    iter_time_ms: float  # wall time of one profiled step (median over `steps`)
    ops: tuple[OpRecord, ...]
    coverage: float  # total op self time / total wall time of the profiled steps (≈ sum of ops / iter_time_ms)
    matched_fraction: float  # fraction of forward op time matched to an IR node


class OnnxNodeRecord(_Frozen):
    """One ONNX Runtime node execution (session profiling), averaged over the timed runs."""

    graph_optimization: Literal["disabled", "enabled"]
    node_name: str
    op_type: str
    kind: OpKind
    provider: str
    time_ms: float
    input_shapes: tuple[tuple[int, ...], ...] = ()
    output_shapes: tuple[tuple[int, ...], ...] = ()


class OnnxProfile(_Frozen):
    provider: str
    runs: int
    iter_time_ms_disabled: float  # median session.run time, graph optimisation off
    iter_time_ms_enabled: float  # median session.run time, graph optimisation on (ORT_ENABLE_ALL)
    nodes: tuple[OnnxNodeRecord, ...]


class Profile(_Frozen):
    """One profiling run of one job on one device."""

    job: JobSpec
    job_id: str
    family: str
    environment: Environment
    iteration: IterationStats | None = None
    ops: OpProfile | None = None
    onnx: OnnxProfile | None = None
    created_at: datetime = Field(default_factory=utc_now)

    @model_validator(mode="before")
    @classmethod
    def _renamed_fields(cls, data: Any) -> Any:
        """Inputs written before the renames of issue 15 (`perfmodel.core.renamed`) under today's names."""
        return upgrade_names(data)

"""Predict a job's iteration time on an accelerator from its graph, without running it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, computed_field

from perfmodel.core.units import samples_per_s
from perfmodel.jobs.spec import JobSpec
from perfmodel.placement.spec import PlacementSpec
from perfmodel.predictor.memory import estimate_memory
from perfmodel.regressors.base import Regressor

# a step that takes over this many times its predicted device time is named host-bound likely: what bounds it is
# not in the graph (an input pipeline, an environment stepped on the CPU, the host's dispatch), so a faster GPU will
# not speed it up as the device time says
HOST_BOUND_RATIO = 2.0
DEVICE_PHASES = ("forward", "backward", "optimizer", "communication")


def device_time_ms(breakdown_ms: dict[str, float]) -> float:
    """The time a step keeps its device busy: forward, backward, optimizer and communication (not the host's
    exposed dispatch, nor the pipeline bubble)."""
    return sum(breakdown_ms.get(phase, 0.0) for phase in DEVICE_PHASES)


class Prediction(BaseModel):
    model_config = ConfigDict(frozen=True)

    job_name: str
    job_id: str
    accelerator: str
    model_version: str
    iter_time_ms: float
    throughput_samples_per_s: float
    interval_ms: tuple[float, float]  # [p10, p90]
    breakdown_ms: dict[str, float]  # forward + backward + optimizer + communication (+ pipeline_bubble) + overhead
    peak_memory_bytes: int  # per device
    extrapolated: bool
    extrapolation_reasons: tuple[str, ...] = ()
    devices: int = 1
    nodes: int = 1
    fits: bool | None = None  # peak_memory_bytes within the accelerator's usable memory (None: no capacity known)
    memory_capacity_bytes: int | None = None
    placement: PlacementSpec | None = None
    # the math each op group was priced at (`perfmodel.predictor.math_modes`): matmul, conv, autocast_fp32
    # (softmax, layer norm, losses), vector (the rest) -> fp32, tf32, fp16 or bf16; None where not priced per op
    math_by_op_group: dict[str, str] | None = None
    # host time eager PyTorch spends issuing the kernels of each phase (forward, backward, optimizer) of one
    # iteration on one device; the part the device could not hide is `breakdown_ms["overhead"]`
    host_issue_ms: dict[str, float] | None = None
    # the kernel sum before the learned whole-step stage corrected it (None: no stage applied)
    composed_iter_time_ms: float | None = None
    # what the model's benchmarks count (`perfmodel zoo show NAME`): images, tokens, mel frames, ...; samples else
    unit: str = "samples"
    items_per_sample: float = 1.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def throughput_items_per_s(self) -> float:
        """Throughput in the model's benchmark unit (`unit`): samples/s x items per sample."""
        return self.throughput_samples_per_s * self.items_per_sample


# every field of `Prediction` in declaration order, at its default (None where it has none): the key order of
# `Prediction.model_dump`, which `prediction_json` keeps
_JSON_TEMPLATE: dict[str, Any] = {name: None if field.is_required() else field.get_default(call_default_factory=True)
                                  for name, field in Prediction.model_fields.items()}


def prediction_json(fields: dict[str, Any]) -> dict[str, Any]:
    """`Prediction(**fields).model_dump(mode="json")` without building the model (a served answer's hot path:
    ~1 us instead of ~9), for fields as `PlacementPredictor.prediction_fields` gives them: plain floats, ints and
    bools, tuples, dicts of those, a `PlacementSpec`. `tests/predictor/test_placed.py` checks the two agree."""
    out = {**_JSON_TEMPLATE, **fields}
    out["interval_ms"] = list(out["interval_ms"])
    out["extrapolation_reasons"] = list(out["extrapolation_reasons"])
    out["breakdown_ms"] = dict(out["breakdown_ms"])
    for name in ("math_by_op_group", "host_issue_ms"):
        if out[name] is not None:
            out[name] = dict(out[name])
    if out["placement"] is not None:
        out["placement"] = out["placement"].model_dump(mode="json")
    out["throughput_items_per_s"] = out["throughput_samples_per_s"] * out["items_per_sample"]
    return out


class Predictor:
    """A loaded model plus what it was trained on. `Predictor.load()` reads the promoted model of the registry."""

    def __init__(self, regressor: Regressor, model_version: str, domain: dict[str, Any]):
        self.regressor = regressor
        self.model_version = model_version
        self.domain = domain

    @classmethod
    def load(cls, ref: str | None = None, models_dir: Any = None) -> Predictor:
        from perfmodel.registry.registry import ModelRegistry, read_domain
        from perfmodel.regressors import load_regressor

        entry = ModelRegistry(models_dir).get(ref)
        return cls(load_regressor(entry.path), entry.ref, read_domain(entry.path))

    def predict(self, spec: JobSpec, accelerator: str = "cpu", *, graph: Any = None) -> Prediction:
        from perfmodel.features.dataset import sample_for_prediction
        from perfmodel.graph import graph_for_job
        from perfmodel.hardware.catalog import get_accelerator
        from perfmodel.predictor.gpu_iteration import fused_bytes_share

        hardware = get_accelerator(accelerator)
        sample = sample_for_prediction(spec, hardware, graph=graph if graph is not None else graph_for_job(spec))
        out = self.regressor.predict([sample])
        optimizer_ms = float(out.optimizer_ms[0])
        # the profiled steps ran torch's default optimizer; a fused one moves only its share of their bytes, and
        # the step is memory-bound: the interval moves with the step
        fused_ms = optimizer_ms * fused_bytes_share(spec.optimizer.value) if spec.fused_optimizer else optimizer_ms
        breakdown = {
            "forward": float(out.forward_ms[0]),
            "backward": float(out.backward_ms[0]),
            "optimizer": fused_ms,
            "communication": 0.0,  # one device: nothing to communicate
            "overhead": float(out.overhead_ms[0]),
        }
        iter_time_ms = sum(breakdown.values())
        scale = iter_time_ms / (iter_time_ms + optimizer_ms - fused_ms) if iter_time_ms > 0 else 1.0
        reasons = self.extrapolation_reasons(sample)
        return Prediction(
            job_name=spec.name, job_id=spec.key(), accelerator=hardware.name, model_version=self.model_version,
            iter_time_ms=iter_time_ms, throughput_samples_per_s=samples_per_s(spec.batch_size, iter_time_ms),
            interval_ms=(float(out.p10_ms[0]) * scale, float(out.p90_ms[0]) * scale), breakdown_ms=breakdown,
            peak_memory_bytes=estimate_memory(spec, sample.graph).peak_bytes,
            extrapolated=bool(reasons), extrapolation_reasons=tuple(reasons),
        )

    def extrapolation_reasons(self, sample: Any) -> list[str]:
        """Why a query lies outside the training data (empty: inside)."""
        d = self.domain
        if not d:
            return ["the model has no recorded training domain"]
        reasons = []
        if sample.hardware.name not in d.get("hardware", []):
            reasons.append(f"accelerator {sample.hardware.name} not in training data")
        if sample.spec.mode.value not in d.get("modes", []):
            reasons.append(f"mode {sample.spec.mode.value} not in training data")
        if sample.spec.precision.value not in d.get("precisions", []):
            reasons.append(f"precision {sample.spec.precision.value} not in training data")
        new_kinds = sorted(set(sample.graph.totals.ops_by_kind) - set(d.get("kinds", [])))
        if new_kinds:
            reasons.append(f"op kinds never trained on: {', '.join(new_kinds)}")
        low, high = d.get("batch_size", [0, float("inf")])
        if not low <= sample.spec.batch_size <= high:
            reasons.append(f"batch size {sample.spec.batch_size} outside [{low}, {high}]")
        flops = sample.graph.totals.flops_fwd + sample.graph.totals.flops_bwd
        low, high = d.get("total_flops", [0, float("inf")])
        if not low <= flops <= high:
            reasons.append(f"total FLOPs {flops:.3g} outside [{low:.3g}, {high:.3g}]")
        return reasons

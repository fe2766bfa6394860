"""The learned whole-step stage applied to a composed prediction (registry role `whole-step`).

    stage = WholeStepStage.load()                      # the promoted whole-step model, or None without one
    corrected = stage.correct(single, features, job)   # features: DevicePredictor.predict_composed's;
                                                       # job: the job's level key (zoo model and math), or None

The composed step of one device (forward + backward + optimizer + overhead from the per-op model) is multiplied by
the stage's factor, component by component, so the breakdown stays an explicit sum. Physically possible by
construction: the factor is never below `roofline_over_composed` (the step never beats Σ rows' roofline: every
kernel at the peak of its math or at the memory bandwidth), and it applies to the compute of one device, so the
placement model on top keeps n devices at most n times one device's throughput. The interval is the stage's
calibrated p10/p90 factor band times the composed step (conformal on family folds: the band of a model family the
stage never saw).
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import JobSpec, Precision, ZooSource
from perfmodel.predictor.math_modes import maths_by_group
from perfmodel.predictor.predict import Prediction
from perfmodel.regressors.whole_step import StepCorrector
from perfmodel.regressors.whole_step_device import JOB, job_level_key

ROLE = "whole-step"
CORRECTED_PARTS = ("forward", "backward", "optimizer", "overhead")


def level_key(spec: JobSpec, hardware: HardwareSpec, known: Container[str] = frozenset()) -> str | None:
    """The key a whole-step stage keeps a measured model's level under (zoo jobs; None for the others). A precision
    whose math on `hardware` is TF32's (fp32 on a GPU without TF32: every op group the same math) takes the TF32
    runs' level, the runs it is the same step as (the public runs' "FP32" is TF32 where the GPU has it); a mixed
    precision whose own level the stage does not keep (`known`: the keys it keeps) takes its twin's
    (`Precision.twin`, the other recipe: NVIDIA's Transformer-XL, GNMT and NCF run a half model with fp32 master
    weights, its Mask R-CNN per-op casts) where the stage keeps that."""
    if not isinstance(spec.source, ZooSource):
        return None
    precision = spec.precision
    if precision in (Precision.fp32, Precision.fp32_strict) and (
            maths_by_group(precision, hardware) == maths_by_group(Precision.tf32, hardware)):
        precision = Precision.tf32
    key = job_level_key(spec.source.name, precision.value)
    twin = job_level_key(spec.source.name, precision.twin.value) if precision.twin is not None else None
    return twin if key not in known and twin in known else key


class WholeStepStage:
    def __init__(self, regressor: StepCorrector, model_version: str):
        self.regressor = regressor
        self.model_version = model_version

    @classmethod
    def load(cls, ref: str | None = None, models_dir: Any = None) -> WholeStepStage | None:
        """The promoted (or named) whole-step model; None when the registry promotes none."""
        from perfmodel.registry.registry import ModelRegistry
        from perfmodel.regressors import load_regressor

        registry = ModelRegistry(models_dir)
        if ref is None and registry.promoted_ref(ROLE) is None:
            return None
        entry = registry.get(ref, role=ROLE)
        return cls(load_regressor(entry.path), entry.ref)

    @cached_property
    def known_levels(self) -> frozenset[str]:
        """The level keys the stage keeps a level for (`job_level_key`); empty for stages without levels."""
        levels = getattr(self.regressor, "levels", None)
        return frozenset(levels()) if callable(levels) else frozenset()

    def factors(self, features: Mapping[str, float], job: str | None = None,
                software: str | None = None) -> tuple[float, float, float]:
        """(factor, low, high) multiplying the composed step, bounded below by the roofline floor. `job`: the job's
        level key (`regressors.whole_step_device.job_level_key`), for stages that keep a level per measured model;
        `software`: the PyTorch (major.minor) it trains with (None: the newest the stage learned)."""
        factor, low, high = self.factors_many([features], [job], [software])
        return float(factor[0]), float(low[0]), float(high[0])

    def factors_many(self, features: Sequence[Mapping[str, float]], jobs: Sequence[str | None],
                     software: Sequence[str | None] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`factors` of many composed steps in one call of the stage's model. A step on an older software version
        takes that version's offset (`software_offset`: how much slower the same GPU, model and math ran on it),
        its interval with it."""
        out = self.regressor.predict(pd.DataFrame([{**f, JOB: job} for f, job in zip(features, jobs)]))
        offset = np.zeros(len(jobs))
        if software is not None and hasattr(self.regressor, "software_offset"):
            offset = np.asarray(self.regressor.software_offset(list(software)), dtype=np.float64)
        floor = np.array([float(f.get("roofline_over_composed", 0.0)) for f in features])
        factor = np.maximum(np.exp(np.asarray(out.log_factor, dtype=np.float64) + offset), floor)
        low = np.maximum(np.minimum(np.exp(np.asarray(out.log_low, dtype=np.float64) + offset), factor), floor)
        high = np.maximum(np.exp(np.asarray(out.log_high, dtype=np.float64) + offset), factor)
        return factor, low, high

    @staticmethod
    def at_least(step: Prediction, twins: Sequence[Prediction]) -> Prediction:
        """`step` never answered faster than `twins`, steps of the same kernels in a faster math
        (`math_modes.FASTER_FLOAT32`). Where its own correction already answers it slower, it is returned as it is;
        where not, it is raised in what the placement model reads of it: forward, backward and optimizer each to at
        least the twin's, and forward + backward + overhead (the stream the host issues: slower kernels hide more of
        its time, so only the sum must not fall) to at least the twin's, so that no placement answers it faster than
        its twin. The breakdown stays an explicit sum; the interval moves with the step."""
        if not any(twin.iter_time_ms > step.iter_time_ms for twin in twins):
            return step  # its own correction orders it: as it is
        breakdown = dict(step.breakdown_ms)
        for twin in twins:
            other = twin.breakdown_ms
            for part in ("forward", "backward", "optimizer"):
                breakdown[part] = max(breakdown.get(part, 0.0), other.get(part, 0.0))
            stream = other.get("forward", 0.0) + other.get("backward", 0.0) + other.get("overhead", 0.0)
            breakdown["overhead"] = max(breakdown.get("overhead", 0.0),
                                        stream - breakdown["forward"] - breakdown["backward"])
        iter_time_ms = sum(breakdown.values())
        if not iter_time_ms > step.iter_time_ms:
            return step
        ratio = iter_time_ms / step.iter_time_ms
        low, high = step.interval_ms
        return step.model_copy(update={
            "iter_time_ms": iter_time_ms, "breakdown_ms": breakdown,
            "interval_ms": (min(low * ratio, iter_time_ms), max(high * ratio, iter_time_ms)),
            "throughput_samples_per_s": step.throughput_samples_per_s / ratio})

    def correct(self, single: Prediction, features: Mapping[str, float], job: str | None = None,
                software: str | None = None) -> Prediction:
        return self.correct_many([single], [features], [job], [software])[0]

    def correct_many(self, singles: Sequence[Prediction], features: Sequence[Mapping[str, float]],
                     jobs: Sequence[str | None], software: Sequence[str | None] | None = None) -> list[Prediction]:
        """Each composed step times its factor, component by component (one call of the stage's model)."""
        if not singles:
            return []
        factors, lows, highs = self.factors_many(features, jobs, software)
        out = []
        for single, factor, low, high in zip(singles, factors.tolist(), lows.tolist(), highs.tolist()):
            breakdown = {k: v * factor if k in CORRECTED_PARTS else v for k, v in single.breakdown_ms.items()}
            iter_time_ms = sum(breakdown.values())
            composed = single.iter_time_ms
            out.append(single.model_copy(update={
                "iter_time_ms": iter_time_ms, "breakdown_ms": breakdown,
                "interval_ms": (min(composed * low, iter_time_ms), max(composed * high, iter_time_ms)),
                "throughput_samples_per_s": single.throughput_samples_per_s * composed / iter_time_ms,
                "model_version": f"{single.model_version}+{self.model_version}",
                "composed_iter_time_ms": composed}))
        return out

    def correct_job(self, single: Prediction, features: Mapping[str, float], spec: JobSpec,
                    hardware: HardwareSpec) -> Prediction:
        """`single`, the composed step of job `spec` on `hardware`, corrected as served (`correct_jobs`)."""
        return self.correct_jobs([single], [features], [spec], [hardware])[0]

    def correct_jobs(self, singles: Sequence[Prediction], features: Sequence[Mapping[str, float]],
                     specs: Sequence[JobSpec], hardware: Sequence[HardwareSpec]) -> list[Prediction]:
        """Each composed step corrected with its job's level (`level_key` on its device) and the offset of the
        PyTorch the job trains with (`JobSpec.pytorch_version`)."""
        return self.correct_many(singles, features,
                                 [level_key(spec, hw, self.known_levels) for spec, hw in zip(specs, hardware)],
                                 [spec.pytorch_version for spec in specs])

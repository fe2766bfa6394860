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

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from perfmodel.predictor.predict import Prediction
from perfmodel.regressors.whole_step_device import JOB

ROLE = "whole-step"
CORRECTED_PARTS = ("forward", "backward", "optimizer", "overhead")


class WholeStepStage:
    def __init__(self, regressor: Any, model_version: str):
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

    def factors(self, features: Mapping[str, float], job: str | None = None) -> tuple[float, float, float]:
        """(factor, low, high) multiplying the composed step, bounded below by the roofline floor. `job`: the job's
        level key (`regressors.whole_step_device.job_level_key`), for stages that keep a level per measured model."""
        out = self.regressor.predict(pd.DataFrame([{**features, JOB: job}]))
        floor = float(features.get("roofline_over_composed", 0.0))
        factor = max(math.exp(float(out.log_factor[0])), floor)
        low = max(min(math.exp(float(out.log_low[0])), factor), floor)
        high = max(math.exp(float(out.log_high[0])), factor)
        return factor, low, high

    def correct(self, single: Prediction, features: Mapping[str, float], job: str | None = None) -> Prediction:
        factor, low, high = self.factors(features, job)
        breakdown = {k: v * factor if k in CORRECTED_PARTS else v for k, v in single.breakdown_ms.items()}
        iter_time_ms = sum(breakdown.values())
        composed = single.iter_time_ms
        return single.model_copy(update={
            "iter_time_ms": iter_time_ms, "breakdown_ms": breakdown,
            "interval_ms": (min(composed * low, iter_time_ms), max(composed * high, iter_time_ms)),
            "throughput_samples_per_s": single.throughput_samples_per_s * composed / iter_time_ms,
            "model_version": f"{single.model_version}+{self.model_version}",
            "composed_iter_time_ms": composed})

"""xgb-whole-step: the learned whole-step stage on top of the composed kernel sum.

A composed prediction (Σ kernels priced one at a time + exposed host time) misses what only a real end-to-end
training step shows: kernels that run slower inside a step than alone (caches shared with the rest of the step,
cuDNN algorithm choices, launch gaps), framework work the graph does not show (autocast casts fused or not, the
optimizer's real kernels, data loading on fast GPUs), and math modes no kernel benchmark covers (TF32). This stage
learns the ratio measured / composed of real whole steps from named features of the composition
(`perfmodel.predictor.composition.COMPOSITION_FEATURES`: time per math group, memory-bound share, kernel count,
host issue time, the graph's size and the device's spec sheet):

- Target: log(measured step ms / composed step ms); one multi-quantile booster (p10, p50, p90) over the given
  feature columns (named, saved in order with the model).
- `predict(frame)` gives the log factor (median) and its p10/p90, the interval conformal-calibrated on out-of-fold
  predictions of inner group folds (groups: model families, so the interval is that of a family never seen).
- The stage never makes a step physically impossible: the caller bounds the corrected step below by the device's
  roofline floor (`PlacementPredictor` does: the factor is at least `roofline_over_composed`).

It follows the scikit-learn contract (`__init__` stores settings, `fit` returns self, `predict` has no side effect)
and saves as UBJSON + `manifest.json` (feature names in order, interval calibration, data hash, metrics).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from perfmodel.core.errors import PerfmodelError
from perfmodel.regressors._xgb import (
    IntervalCalibration,
    QuantileBoosterSettings,
    family_folds,
    load_quantile_model,
    predict_quantiles,
    save_quantile_model,
    train_booster,
)
from perfmodel.regressors.manifest import data_hash

TARGET = "log_ratio"  # log(measured / composed)


@dataclass(frozen=True)
class StepCorrection:
    """Per-row log factors (natural log) to multiply the composed step by: median and the calibrated 80 % band."""

    log_factor: np.ndarray
    log_low: np.ndarray
    log_high: np.ndarray


class StepCorrector(Protocol):
    """What the serving whole-step stage (`perfmodel.predictor.whole_step.WholeStepStage`) asks of its model
    (`WholeStepRegressor`, `whole_step_device.DeviceStepRegressor`): log factors for rows of composition features
    (and, where the model keeps a level per measured model, the `job` column). A model may also keep levels
    (`levels()`) and software offsets (`software_offset(versions)`); the stage looks for them."""

    name: str

    def predict(self, frame: pd.DataFrame) -> StepCorrection: ...


@dataclass(eq=False)
class WholeStepRegressor(QuantileBoosterSettings):
    name = "xgb-whole-step"

    min_child_weight: float = 3.0
    nthread: int = 1
    feature_names: Sequence[str] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        self.feature_names = tuple(self.feature_names)

    def _x(self, frame: pd.DataFrame) -> np.ndarray:
        missing = [name for name in self.feature_names if name not in frame]
        if missing:
            raise PerfmodelError(f"whole-step features missing: {missing}")
        return frame[list(self.feature_names)].to_numpy(dtype=np.float64)

    def _fit_booster(self, x: np.ndarray, y: np.ndarray):  # returns an xgboost Booster
        return train_booster(x, y, self.feature_names, self._params(), self.n_estimators)

    def fit(self, frame: pd.DataFrame, groups: Sequence[str] | None = None,
            keys: Sequence[str] | None = None) -> WholeStepRegressor:
        """Learn from `frame` (the feature columns and `log_ratio`). `groups`: the model family of each row (inner
        folds for the interval never split one); `keys`: each row's identity, for the training-data hash."""
        if not self.feature_names:
            raise PerfmodelError("give the feature names to learn from (feature_names=...)")
        if TARGET not in frame or len(frame) < 5:
            raise PerfmodelError(f"need at least 5 rows with a {TARGET!r} column to fit the whole-step stage")
        x, y = self._x(frame), frame[TARGET].to_numpy(dtype=np.float64)
        if not np.all(np.isfinite(y)):
            raise PerfmodelError(f"{TARGET} must be finite")
        groups = list(groups) if groups is not None else [str(i) for i in range(len(frame))]
        median_index = list(self.quantiles).index(0.5)
        oof = np.zeros((len(y), len(self.quantiles)))
        for test in family_folds(groups, self.inner_folds):
            train = np.setdiff1d(np.arange(len(y)), test)
            booster = self._fit_booster(x[train], y[train])
            oof[test] = predict_quantiles(booster, x[test], self.feature_names, len(self.quantiles), self.nthread)
        self.booster_ = self._fit_booster(x, y)
        measured = np.exp(y)
        self.calibration_ = IntervalCalibration.fit(measured, np.exp(oof[:, 0]), np.exp(oof[:, -1]),
                                                    self.quantiles[0], self.quantiles[-1])
        oof_ape = np.abs(np.exp(oof[:, median_index] - y) - 1.0)
        self.metrics_ = {"oof_mape_vs_measured": float(np.mean(oof_ape)),
                         "composed_mape": float(np.mean(np.abs(np.exp(-y) - 1.0))), "rows": int(len(y)),
                         "groups": len(set(groups))}
        self.training_hash_ = data_hash(keys if keys is not None else map(str, range(len(y))))
        self.n_samples_ = len(y)
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "booster_"):
            raise PerfmodelError("xgb-whole-step is not fitted: call fit(frame) or load(directory) first")

    def predict(self, frame: pd.DataFrame) -> StepCorrection:
        """Log factors for every row of `frame` (the feature columns); no side effects."""
        self._check_fitted()
        q = predict_quantiles(self.booster_, self._x(frame), self.feature_names, len(self.quantiles), self.nthread)
        median = q[:, list(self.quantiles).index(0.5)]
        low, high = self.calibration_.apply(np.exp(median), np.exp(q[:, 0]), np.exp(q[:, -1]))
        return StepCorrection(median, np.log(low), np.log(high))

    def save(self, directory: str | Path) -> Path:
        self._check_fitted()
        return save_quantile_model(self, directory, self.feature_names,
                                   {"target": "log(measured step ms / composed step ms), natural log"})

    @classmethod
    def load(cls, directory: str | Path) -> WholeStepRegressor:
        return load_quantile_model(cls, directory)[0]

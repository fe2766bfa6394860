"""xgb-graph: one XGBoost row per job, from aggregate graph features (`GRAPH_FEATURES`).

- Target: log(iteration ms), modelled as log(Σ roofline ms) + a learned correction: the booster is fitted to
  log(measured / roofline) and the log roofline is added back (so the trees learn an efficiency, which carries
  across sizes better than an absolute time).
- One multi-quantile booster (`reg:quantileerror`, alphas `quantiles`): median, p10 and p90. The p10/p90 are then
  conformal-calibrated on out-of-fold predictions of inner family folds (`IntervalCalibration`, saved in the
  manifest's normalisation): with ~160 jobs the raw tails are too narrow for families never seen.
- Breakdown: the predicted median is split into forward / backward / optimizer / overhead in proportion to the
  job's roofline parts (`perfmodel.features.whole_graph.roofline_parts_ms`: Σ node roofline per phase, the optimizer's
  parameter traffic at memory bandwidth, a nominal dispatch cost per op). It is a heuristic split, not learned: the
  parts always sum exactly to the prediction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfmodel.core.errors import PerfmodelError
from perfmodel.features.sample import Sample
from perfmodel.features.whole_graph import GRAPH_FEATURES, graph_feature_matrix, roofline_parts_ms
from perfmodel.regressors._xgb import (
    IntervalCalibration,
    QuantileBoosterSettings,
    family_folds,
    iteration_metrics,
    load_quantile_model,
    measured_ms,
    predict_quantiles,
    save_quantile_model,
    train_booster,
    training_hash,
)
from perfmodel.regressors.base import IterationPrediction

PARTS = ("forward", "backward", "optimizer", "overhead")


def _features(samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
    """(feature matrix, roofline parts (samples × PARTS) in ms)."""
    x = graph_feature_matrix([(s.graph, s.hardware, s.spec) for s in samples])
    parts = np.asarray([[p[name] for name in PARTS] for p in
                        (roofline_parts_ms(s.graph, s.hardware, s.spec) for s in samples)], dtype=np.float64)
    return x, parts.reshape(len(samples), len(PARTS))


@dataclass(eq=False)
class XGBGraphRegressor(QuantileBoosterSettings):
    name = "xgb-graph"

    # --- fit / predict ----------------------------------------------------------------------------------------

    def fit(self, samples: Sequence[Sample]) -> XGBGraphRegressor:
        samples = list(samples)
        params = self._params()
        measured = measured_ms(samples)
        x, parts = _features(samples)
        roofline = parts.sum(axis=1)
        y = np.log(measured / roofline)

        oof = np.zeros((len(samples), len(self.quantiles)))
        for test in family_folds([s.family for s in samples], self.inner_folds):
            train = np.setdiff1d(np.arange(len(samples)), test)
            booster = train_booster(x[train], y[train], GRAPH_FEATURES, params, self.n_estimators)
            oof[test] = self._quantiles_ms(booster, x[test], roofline[test])
        self.booster_ = train_booster(x, y, GRAPH_FEATURES, params, self.n_estimators)

        median = self.quantiles.index(0.5)
        self.calibration_ = IntervalCalibration.fit(measured, oof[:, 0], oof[:, -1], self.quantiles[0],
                                                    self.quantiles[-1])
        self.training_hash_ = training_hash(samples)
        self.n_samples_ = len(samples)
        fitted = self.predict(samples)
        oof_low, oof_high = self.calibration_.apply(oof[:, median], oof[:, 0], oof[:, -1])
        self.metrics_ = {"train": iteration_metrics(measured, fitted.iter_time_ms, fitted.p10_ms, fitted.p90_ms),
                         "inner_oof": iteration_metrics(measured, oof[:, median], oof_low, oof_high)}
        return self

    def predict(self, samples: Sequence[Sample]) -> IterationPrediction:
        self._check_fitted()
        samples = list(samples)
        x, parts = _features(samples)
        quantiles = self._quantiles_ms(self.booster_, x, parts.sum(axis=1))
        iteration = quantiles[:, self.quantiles.index(0.5)]
        low, high = self.calibration_.apply(iteration, quantiles[:, 0], quantiles[:, -1])
        shares = parts / parts.sum(axis=1, keepdims=True)
        split = {name: iteration * shares[:, i] for i, name in enumerate(PARTS)}
        # the last part takes the rounding remainder, so the parts add up to the iteration exactly
        split["overhead"] = iteration - split["forward"] - split["backward"] - split["optimizer"]
        return IterationPrediction(iter_time_ms=iteration, p10_ms=low, p90_ms=high, forward_ms=split["forward"],
                                   backward_ms=split["backward"], optimizer_ms=split["optimizer"],
                                   overhead_ms=split["overhead"])

    def _quantiles_ms(self, booster, x: np.ndarray, roofline_ms: np.ndarray) -> np.ndarray:
        log_ratio = predict_quantiles(booster, x, GRAPH_FEATURES, len(self.quantiles), self.nthread)
        return np.exp(log_ratio) * roofline_ms[:, None]

    def _check_fitted(self) -> None:
        if not hasattr(self, "booster_"):
            raise PerfmodelError("xgb-graph is not fitted: call fit(samples) or load(directory) first")

    # --- persistence ------------------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        self._check_fitted()
        return save_quantile_model(self, directory, GRAPH_FEATURES, {
            "target": "log(iteration ms / roofline ms); roofline ms = Σ roofline_parts_ms",
            "breakdown": "median split by roofline_parts_ms proportions (forward, backward, optimizer, overhead)",
        })

    @classmethod
    def load(cls, directory: str | Path) -> XGBGraphRegressor:
        return load_quantile_model(cls, directory, GRAPH_FEATURES)[0]

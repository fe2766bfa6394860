"""xgb-ops: per-op XGBoost. Predicts every IR node's time in each phase, sums them, adds a fitted per-iteration
overhead and an iteration-level interval.

- Rows: one per (IR node, phase) from `node_feature_matrix` (columns `NODE_FEATURES`). Training uses the keys the
  profiler attributed time to (`Sample.node_times_ms`) plus zero-time rows for shape-only (`view`) nodes it did not
  time; other untimed nodes (calls the profiler could not match) are left out, their time stays in the residual.
- Target: log(node ms + `EPS_MS`), learned relative to the node's roofline: the booster fits
  log(ms + EPS_MS) − log(roofline ms + `DISPATCH_MS_PER_OP`) and the offset is added back, so node times scale with
  their FLOPs and bytes even for op kinds or sizes a held-out family alone has. One multi-quantile booster
  (`reg:quantileerror`, alphas `quantiles`); the median column gives each node's time.
- Iteration = Σ node medians + overhead terms. The terms (`OVERHEAD_FEATURES`) are fitted by non-negative least
  squares, relative to the measured time, on (measured − Σ out-of-fold node medians). The parameter-proportional
  terms (`OPTIMIZER_TERMS`) are reported as optimizer time, the rest as overhead.
- Interval: summed per-op p10/p90 is no iteration interval (op errors are correlated), so it is calibrated at the
  iteration level: multiplicative bounds from the quantiles of log(measured / predicted) over out-of-fold
  predictions of inner family folds (`IntervalCalibration`), saved in the manifest's normalisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfmodel.core import cost
from perfmodel.core.errors import PerfmodelError
from perfmodel.core.opkinds import OpKind
from perfmodel.features.nodes import NODE_FEATURES, node_cost, node_feature_matrix, roofline_ms
from perfmodel.features.sample import Sample
from perfmodel.features.whole_graph import DISPATCH_MS_PER_OP, OPTIMIZER_TENSOR_PASSES, PARAM_BYTES, optimizer_name
from perfmodel.regressors._xgb import (
    IntervalCalibration,
    QuantileBoosterSettings,
    family_folds,
    iteration_metrics,
    load_quantile_model,
    measured_ms,
    nnls,
    predict_quantiles,
    save_quantile_model,
    train_booster,
    training_hash,
)
from perfmodel.regressors.base import IterationPrediction
from perfmodel.regressors.manifest import Manifest

EPS_MS = 1e-4  # added before the log: an untimed view node is log(EPS_MS)

# per-iteration terms of (measured − Σ node times), each with a non-negative coefficient (in ms per unit)
OVERHEAD_FEATURES = (
    "constant",  # 1: fixed per-step cost (step call, synchronise)
    "compute_ops_k",  # (node, phase) rows of non-view nodes / 1000: per-op dispatch and autograd bookkeeping
    "optimizer_roofline_ms",  # parameter state moved once at memory bandwidth (0 for inference)
    "optimizer_param_tensors_k",  # parameterised nodes / 1000 (0 for inference): per-tensor optimizer cost
)
OPTIMIZER_TERMS = ("optimizer_roofline_ms", "optimizer_param_tensors_k")


@dataclass(frozen=True)
class _Rows:
    """A sample's node rows: features, key and whether the row is backward / a view node."""

    x: np.ndarray
    keys: list[tuple[str, str]]
    backward: np.ndarray
    view: np.ndarray
    offset: np.ndarray  # log(roofline ms + DISPATCH_MS_PER_OP): the booster learns the log time relative to it


def _rows(sample: Sample) -> _Rows:
    x, keys = node_feature_matrix(sample.graph, sample.hardware)
    nodes = {n.id: n for n in sample.graph.nodes}
    offset = []
    for node_id, phase in keys:
        flops, bytes_read, bytes_written = node_cost(nodes[node_id], phase)
        offset.append(np.log(roofline_ms(flops, bytes_read + bytes_written, sample.hardware) + DISPATCH_MS_PER_OP))
    return _Rows(x=x, keys=keys, backward=np.asarray([phase == "backward" for _, phase in keys], dtype=bool),
                 view=np.asarray([nodes[node_id].kind == OpKind.view for node_id, _ in keys], dtype=bool),
                 offset=np.asarray(offset, dtype=np.float64))


def _training_rows(sample: Sample, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
    """Rows with a known time (timed keys, and untimed view nodes at 0 ms) and their targets."""
    times: dict[tuple[str, str], float] = dict(sample.node_times_ms.items())  # keyed as the rows are
    keep = np.asarray([key in times for key in rows.keys], dtype=bool) | rows.view
    ms = np.asarray([times.get(key, 0.0) for key, k in zip(rows.keys, keep) if k], dtype=np.float64)
    return rows.x[keep], np.log(np.maximum(ms, 0.0) + EPS_MS) - rows.offset[keep]


def overhead_features(sample: Sample, rows: _Rows) -> dict[str, float]:
    optimizer = optimizer_name(sample.spec)
    graph, hw = sample.graph, sample.hardware
    optimizer_bytes = graph.totals.params * PARAM_BYTES * OPTIMIZER_TENSOR_PASSES[optimizer] if optimizer else 0
    return {
        "constant": 1.0,
        "compute_ops_k": float(np.sum(~rows.view)) / 1000,
        "optimizer_roofline_ms": float(cost.memory_ms(optimizer_bytes, hw.memory_bandwidth_gb_s)),
        "optimizer_param_tensors_k": sum(1 for n in graph.nodes if n.params > 0) / 1000 if optimizer else 0.0,
    }


def overhead_matrix(samples: Sequence[Sample], rows: Sequence[_Rows]) -> np.ndarray:
    """(samples, OVERHEAD_FEATURES) matrix, columns in order."""
    table = [overhead_features(s, r) for s, r in zip(samples, rows)]
    return np.asarray([[t[f] for f in OVERHEAD_FEATURES] for t in table], dtype=np.float64).reshape(
        len(table), len(OVERHEAD_FEATURES))


@dataclass(eq=False)
class XGBOpsRegressor(QuantileBoosterSettings):
    name = "xgb-ops"

    max_depth: int = 8
    learning_rate: float = 0.1

    # --- fit / predict ----------------------------------------------------------------------------------------

    def fit(self, samples: Sequence[Sample]) -> XGBOpsRegressor:
        samples = list(samples)
        params = self._params()
        measured = measured_ms(samples)
        rows = [_rows(s) for s in samples]
        training = [_training_rows(s, r) for s, r in zip(samples, rows)]

        def train_on(indices: Sequence[int]):
            x = np.concatenate([training[i][0] for i in indices])
            y = np.concatenate([training[i][1] for i in indices])
            return train_booster(x, y, NODE_FEATURES, params, self.n_estimators)

        # out-of-fold node sums: the overhead terms and the interval are fitted on what unseen families look like
        oof_nodes = np.zeros(len(samples))
        for test in family_folds([s.family for s in samples], self.inner_folds):
            train = np.setdiff1d(np.arange(len(samples)), test)
            forward, backward = self._node_sums([rows[i] for i in test], train_on(train.tolist()))
            oof_nodes[test] = forward + backward
        self.booster_ = train_on(range(len(samples)))

        extra = overhead_matrix(samples, rows)
        coefficients = nnls(extra / measured[:, None], (measured - oof_nodes) / measured)
        self.overhead_coefficients_ = dict(zip(OVERHEAD_FEATURES, coefficients.tolist()))
        oof = np.maximum(oof_nodes + extra @ coefficients, EPS_MS)
        self.calibration_ = IntervalCalibration.fit(measured, oof, oof, self.quantiles[0], self.quantiles[-1])

        self.training_hash_ = training_hash(samples)
        self.n_samples_ = len(samples)
        fitted = self.predict(samples)
        oof_low, oof_high = self.calibration_.apply(oof, oof, oof)
        self.metrics_ = {"train": iteration_metrics(measured, fitted.iter_time_ms, fitted.p10_ms, fitted.p90_ms),
                         "inner_oof": iteration_metrics(measured, oof, oof_low, oof_high),
                         "training_rows": int(sum(len(t[1]) for t in training))}
        return self

    def predict(self, samples: Sequence[Sample]) -> IterationPrediction:
        self._check_fitted()
        samples = list(samples)
        rows = [_rows(s) for s in samples]
        forward, backward = self._node_sums(rows, self.booster_)
        extra = overhead_matrix(samples, rows)
        terms = {f: extra[:, i] * self.overhead_coefficients_[f] for i, f in enumerate(OVERHEAD_FEATURES)}
        optimizer = sum((terms[f] for f in OPTIMIZER_TERMS), np.zeros(len(samples)))
        overhead = sum((terms[f] for f in OVERHEAD_FEATURES if f not in OPTIMIZER_TERMS), np.zeros(len(samples)))
        iteration = forward + backward + optimizer + overhead
        low, high = self.calibration_.apply(iteration, iteration, iteration)
        return IterationPrediction(iter_time_ms=iteration, p10_ms=low, p90_ms=high, forward_ms=forward,
                                   backward_ms=backward, optimizer_ms=optimizer, overhead_ms=overhead)

    def _node_sums(self, rows: Sequence[_Rows], booster) -> tuple[np.ndarray, np.ndarray]:
        """Σ predicted node medians per sample: (forward ms, backward ms)."""
        if not rows:
            return np.zeros(0), np.zeros(0)
        x = np.concatenate([r.x for r in rows])
        owner = np.concatenate([np.full(len(r.keys), i) for i, r in enumerate(rows)]).astype(np.int64)
        backward = np.concatenate([r.backward for r in rows])
        offset = np.concatenate([r.offset for r in rows])
        quantiles = predict_quantiles(booster, x, NODE_FEATURES, len(self.quantiles), self.nthread)
        ms = np.maximum(np.exp(quantiles[:, self.quantiles.index(0.5)] + offset) - EPS_MS, 0.0)
        forward_ms = np.bincount(owner, weights=np.where(backward, 0.0, ms), minlength=len(rows))
        backward_ms = np.bincount(owner, weights=np.where(backward, ms, 0.0), minlength=len(rows))
        return forward_ms, backward_ms

    def _check_fitted(self) -> None:
        if not hasattr(self, "booster_"):
            raise PerfmodelError("xgb-ops is not fitted: call fit(samples) or load(directory) first")

    # --- persistence ------------------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        self._check_fitted()
        return save_quantile_model(self, directory, NODE_FEATURES, {
            "target": "log(node ms + target_eps_ms) - log(node roofline ms + offset_floor_ms); the median "
                      "column of the multi-quantile booster",
            "target_eps_ms": EPS_MS,
            "offset_floor_ms": DISPATCH_MS_PER_OP,
            "overhead_features": list(OVERHEAD_FEATURES),
            "overhead_coefficients": self.overhead_coefficients_,
            "optimizer_terms": list(OPTIMIZER_TERMS),
        })

    @classmethod
    def load(cls, directory: str | Path) -> XGBOpsRegressor:
        def check(manifest: Manifest) -> None:
            norm = manifest.normalisation
            if (tuple(norm.get("overhead_features", ())) != OVERHEAD_FEATURES
                    or norm.get("target_eps_ms") != EPS_MS or norm.get("offset_floor_ms") != DISPATCH_MS_PER_OP):
                raise PerfmodelError(f"{directory}: overhead terms or target transform differ from this perfmodel's")

        model, manifest = load_quantile_model(cls, directory, NODE_FEATURES, check)
        model.overhead_coefficients_ = {f: float(manifest.normalisation["overhead_coefficients"][f])
                                        for f in OVERHEAD_FEATURES}
        return model

"""Family-grouped k-fold evaluation of regressors, and its error metrics (pure functions over plain records).

For each fold (`family_folds`: a family is never in train and test at once) a fresh regressor from each factory is
fitted on the training samples and predicts the held-out ones. Every held-out prediction is kept
(`HeldOutPrediction`); metrics are computed from them per regressor, overall and per family:

- APE = |predicted - measured| / measured, in %; MAPE (mean), median APE and p90 APE (90th percentile);
- interval coverage: the fraction of measured times inside [p10, p90] (0.8 for a calibrated 80 % interval);
- median ratio: median of predicted / measured (< 1: the regressor predicts too fast);
- median CV: the median coefficient of variation of the held-out measurements, in %: the run-to-run noise an
  error should be read against.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from perfmodel.core.accuracy import ape_pct as accuracy_ape_pct
from perfmodel.core.errors import PerfmodelError
from perfmodel.features.dataset import family_folds
from perfmodel.features.sample import Sample
from perfmodel.regressors.base import Regressor

RegressorFactory = Callable[[], Regressor]


@dataclass(frozen=True)
class HeldOutPrediction:
    """One held-out sample's prediction by one regressor (times in ms)."""

    regressor: str
    fold: int
    family: str
    job_name: str
    profile_id: int | None
    measured_ms: float
    predicted_ms: float
    p10_ms: float
    p90_ms: float
    measured_cv: float | None  # coefficient of variation of the measurement (fraction), None if unknown

    @property
    def ape_pct(self) -> float:
        return float(accuracy_ape_pct(self.predicted_ms, self.measured_ms))

    @property
    def in_interval(self) -> bool:
        return self.p10_ms <= self.measured_ms <= self.p90_ms


@dataclass(frozen=True)
class ErrorMetrics:
    """Errors of one regressor on a set of held-out samples: all of them (`family` None) or one family's."""

    regressor: str
    family: str | None
    samples: int
    mape_pct: float
    median_ape_pct: float
    p90_ape_pct: float
    interval_coverage: float  # fraction of measured times inside [p10, p90]
    median_ratio: float  # median of predicted / measured
    median_cv_pct: float | None  # median CV of the measurements (noise), None if no sample has one


@dataclass(frozen=True)
class EvaluationResult:
    folds: int
    seed: int
    regressors: tuple[str, ...]  # in the order given
    predictions: tuple[HeldOutPrediction, ...]
    overall: tuple[ErrorMetrics, ...]  # one per regressor, in `regressors` order
    per_family: tuple[ErrorMetrics, ...]  # per (regressor, family), families sorted
    fit_s: Mapping[str, float]  # total fit wall time per regressor over the folds
    predict_s: Mapping[str, float]  # total predict wall time per regressor over the folds

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(sorted({p.family for p in self.predictions}))

    def overall_for(self, regressor: str) -> ErrorMetrics:
        return next(m for m in self.overall if m.regressor == regressor)

    def family_metrics(self, regressor: str) -> dict[str, ErrorMetrics]:
        return {m.family: m for m in self.per_family if m.regressor == regressor and m.family is not None}

    def worst_family(self, regressor: str) -> ErrorMetrics | None:
        by_family = self.family_metrics(regressor)
        return max(by_family.values(), key=lambda m: m.mape_pct) if by_family else None

    @property
    def noise_median_cv_pct(self) -> float | None:
        """Median CV of the held-out measurements (each sample once), in %."""
        first = self.regressors[0] if self.regressors else None
        return _median_cv_pct(p for p in self.predictions if p.regressor == first)


def evaluate(regressor_factories: Mapping[str, RegressorFactory], samples: Sequence[Sample], k: int = 5,
             seed: int = 0) -> EvaluationResult:
    """Family-grouped k-fold cross-validation of every factory's regressors on measured `samples`."""
    samples = list(samples)
    unmeasured = [i for i, s in enumerate(samples) if not s.iter_time_ms or s.iter_time_ms <= 0]
    if unmeasured:
        raise PerfmodelError(f"{len(unmeasured)} samples have no measured iteration time (first: #{unmeasured[0]})")
    if not regressor_factories:
        raise PerfmodelError("no regressors to evaluate")
    folds = family_folds(samples, k, seed=seed)
    predictions: list[HeldOutPrediction] = []
    fit_s = dict.fromkeys(regressor_factories, 0.0)
    predict_s = dict.fromkeys(regressor_factories, 0.0)
    for fold, (train_idx, test_idx) in enumerate(folds):
        train = [samples[i] for i in train_idx]
        test = [samples[i] for i in test_idx]
        for name, factory in regressor_factories.items():
            start = time.perf_counter()
            regressor = factory().fit(train)
            fit_s[name] += time.perf_counter() - start
            start = time.perf_counter()
            prediction = regressor.predict(test)
            predict_s[name] += time.perf_counter() - start
            predictions.extend(_held_out(name, fold, test, prediction.iter_time_ms, prediction.p10_ms,
                                         prediction.p90_ms))
    names = tuple(regressor_factories)
    return EvaluationResult(
        folds=len(folds), seed=seed, regressors=names, predictions=tuple(predictions),
        overall=tuple(error_metrics(p for p in predictions if p.regressor == name) for name in names),
        per_family=tuple(per_family_metrics(predictions, names)), fit_s=fit_s, predict_s=predict_s,
    )


def _measured_ms(sample: Sample) -> float:
    """A held-out sample's measured iteration time (every profiled sample has one)."""
    if sample.iter_time_ms is None:
        raise PerfmodelError(f"sample {sample.profile_id!r} has no measured iteration time to evaluate against")
    return float(sample.iter_time_ms)


def _held_out(name: str, fold: int, test: list[Sample], predicted: np.ndarray, p10: np.ndarray,
              p90: np.ndarray) -> list[HeldOutPrediction]:
    for label, values in (("iter_time_ms", predicted), ("p10_ms", p10), ("p90_ms", p90)):
        if np.shape(values) != (len(test),):
            raise PerfmodelError(f"regressor {name!r} returned {label} of shape {np.shape(values)} for "
                                 f"{len(test)} samples")
    return [
        HeldOutPrediction(regressor=name, fold=fold, family=s.family, job_name=s.spec.name, profile_id=s.profile_id,
                          measured_ms=_measured_ms(s), predicted_ms=float(predicted[i]),
                          p10_ms=float(p10[i]), p90_ms=float(p90[i]), measured_cv=s.iter_time_cv)
        for i, s in enumerate(test)
    ]


def error_metrics(predictions: Iterable[HeldOutPrediction], family: str | None = None) -> ErrorMetrics:
    """Metrics of a non-empty set of one regressor's predictions (see the module doc)."""
    rows = list(predictions)
    if not rows:
        raise PerfmodelError("no predictions to compute metrics from")
    ape = np.array([p.ape_pct for p in rows])
    ratio = np.array([p.predicted_ms / p.measured_ms for p in rows])
    return ErrorMetrics(
        regressor=rows[0].regressor,
        family=family,
        samples=len(rows),
        mape_pct=float(ape.mean()),
        median_ape_pct=float(np.median(ape)),
        p90_ape_pct=float(np.percentile(ape, 90)),
        interval_coverage=float(np.mean([p.in_interval for p in rows])),
        median_ratio=float(np.median(ratio)),
        median_cv_pct=_median_cv_pct(rows),
    )


def per_family_metrics(predictions: Sequence[HeldOutPrediction], regressors: Sequence[str]) -> list[ErrorMetrics]:
    families = sorted({p.family for p in predictions})
    return [
        error_metrics([p for p in predictions if p.regressor == name and p.family == family], family)
        for name in regressors for family in families
        if any(p.regressor == name and p.family == family for p in predictions)
    ]


def _median_cv_pct(predictions: Iterable[HeldOutPrediction]) -> float | None:
    cvs = [p.measured_cv for p in predictions if p.measured_cv is not None]
    return float(np.median(cvs)) * 100 if cvs else None

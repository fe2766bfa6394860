"""What the two XGBoost regressors share: the multi-quantile booster, family folds for out-of-fold predictions,
the iteration-level interval calibration, a small non-negative least squares, the training-data hash.

One booster learns every quantile at once (`objective="reg:quantileerror"`, `quantile_alpha=[0.1, 0.5, 0.9]`):
its output has one column per quantile, sorted per row so that quantiles never cross.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.lru import LRU
from perfmodel.core.renamed import upgrade_feature_names
from perfmodel.features.sample import Sample
from perfmodel.regressors.manifest import Manifest, data_hash

# XGBoost's binary JSON (UBJSON): the same trees as its text JSON at two thirds of the size, loaded eight times
# faster (0.03 s instead of 0.24 s for the shipped xgb-ops model, which every service start loads)
MODEL_FILE = "model.ubj"
TEXT_MODEL_FILE = "model.json"  # what models saved before used; still loaded
# boosters parsed once per process per distinct file content (`read_booster`): the shipped registry holds 35
MAX_SHARED_BOOSTERS = 64
_boosters: LRU[bytes, Any] = LRU(MAX_SHARED_BOOSTERS)
_boosters_lock = threading.Lock()


def read_booster(path: str | Path, prepare: Callable[[Any], None] | None = None):  # returns an xgboost Booster
    """The XGBoost booster saved at `path`, parsed once per process for the same file content (a hash of its bytes:
    hashing a booster file takes a tenth of parsing it): an engine reloads the registry whenever a model is
    promoted, and every service test opens an app on its own copy of the registry, so without it each load parses
    every booster again (about 0.04 s of an app start's 0.08 s). `prepare` runs once on a newly parsed booster, before
    anyone else sees it. Callers share the booster, so they must not change it afterwards; prediction from a tree
    booster is thread-safe (XGBoost >= 1.4)."""
    import xgboost as xgb

    content = Path(path).read_bytes()
    key = hashlib.blake2b(content, digest_size=16).digest()
    booster = _boosters.get(key)
    if booster is not None:
        return booster
    with _boosters_lock:  # one parse per content, however many engines load it at once
        booster = _boosters.get(key)
        if booster is None:
            booster = xgb.Booster()
            booster.load_model(bytearray(content))
            if prepare is not None:
                prepare(booster)
            _boosters.put(key, booster)
    return booster


def booster_params(*, max_depth: int, learning_rate: float, min_child_weight: float, seed: int, nthread: int,
                   quantiles: Sequence[float]) -> dict:
    return {
        "objective": "reg:quantileerror",
        "quantile_alpha": list(quantiles),
        "tree_method": "hist",
        "max_depth": max_depth,
        "eta": learning_rate,
        "min_child_weight": min_child_weight,
        "seed": seed,
        "nthread": nthread,
    }


@dataclass(eq=False)
class QuantileBoosterSettings:
    """The settings the XGBoost regressors share, stored as given (scikit-learn's `__init__` contract: the dataclass
    writes it). A regressor is a dataclass too and redeclares the fields whose defaults are its own; `eq=False`
    keeps an estimator equal only to itself (and hashable), as a fitted model should be."""

    n_estimators: int = 300
    max_depth: int = 3
    learning_rate: float = 0.05
    min_child_weight: float = 5.0
    seed: int = 0
    quantiles: Sequence[float] = (0.1, 0.5, 0.9)
    inner_folds: int = 5
    nthread: int = 2

    def __post_init__(self) -> None:
        self.quantiles = tuple(self.quantiles)

    def get_params(self) -> dict:
        """The settings, JSON-ready (sequences as lists): what a manifest saves and `from_settings` takes back."""
        params = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: list(value) if isinstance(value, tuple) else value for name, value in params.items()}

    def _params(self) -> dict:
        if list(self.quantiles) != sorted(self.quantiles) or 0.5 not in self.quantiles or len(self.quantiles) < 3:
            raise PerfmodelError(f"quantiles must be increasing and include 0.5, got {self.quantiles}")
        return booster_params(max_depth=self.max_depth, learning_rate=self.learning_rate,
                              min_child_weight=self.min_child_weight, seed=self.seed, nthread=self.nthread,
                              quantiles=self.quantiles)


def train_booster(x: np.ndarray, y: np.ndarray, feature_names: Sequence[str], params: dict, n_estimators: int):
    import xgboost as xgb

    dtrain = xgb.DMatrix(x, label=y, feature_names=list(feature_names), nthread=params["nthread"])
    return xgb.train(params, dtrain, num_boost_round=n_estimators)


def predict_quantiles(booster, x: np.ndarray, feature_names: Sequence[str], n_quantiles: int,
                      nthread: int) -> np.ndarray:
    """(rows, quantiles) predictions, sorted along each row (no quantile crossing), as float64."""
    import xgboost as xgb

    if len(x) == 0:
        return np.zeros((0, n_quantiles))
    out = booster.predict(xgb.DMatrix(x, feature_names=list(feature_names), nthread=nthread))
    out = np.asarray(out, dtype=np.float64).reshape(len(x), n_quantiles)
    return np.sort(out, axis=1)


def save_booster(booster, directory: Path) -> Path:
    path = Path(directory) / MODEL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(path))
    return path


def load_booster(directory: Path, manifest: Manifest, feature_names: Sequence[str], regressor: str):
    """The booster saved in `directory`, after checking the manifest's regressor and feature names."""
    if manifest.regressor != regressor:
        raise PerfmodelError(f"{directory} holds a {manifest.regressor!r} model, not {regressor!r}")
    manifest.check_features(feature_names)
    artifact = TEXT_MODEL_FILE if TEXT_MODEL_FILE in manifest.artifacts else MODEL_FILE

    def upgrade_names(booster) -> None:
        booster.feature_names = list(upgrade_feature_names(booster.feature_names or ())) or None

    booster = read_booster(Path(directory) / artifact, upgrade_names)
    if tuple(booster.feature_names or ()) != tuple(feature_names):
        raise PerfmodelError(f"{directory}/{artifact}: booster feature names differ from its manifest's")
    return booster


def save_quantile_model(model, directory: str | Path, feature_names: Sequence[str], normalisation: dict) -> Path:
    """Save a fitted multi-quantile regressor (`booster_`, `calibration_`, `training_hash_`, `n_samples_`,
    `metrics_`): its booster and a manifest whose normalisation is `normalisation` plus the interval calibration."""
    directory = Path(directory)
    save_booster(model.booster_, directory)
    Manifest(
        regressor=model.name,
        feature_names=tuple(feature_names),
        normalisation={**normalisation, "interval": model.calibration_.to_json()},
        settings=model.get_params(),
        artifacts=(MODEL_FILE,),
        training_data_hash=model.training_hash_,
        training_samples=model.n_samples_,
        metrics=model.metrics_,
    ).write(directory)
    return directory


def load_quantile_model(cls, directory: str | Path, feature_names: Sequence[str] | None = None, check=None):
    """(model, manifest) of what `save_quantile_model` wrote. `feature_names`: what the booster must have (None:
    the model's own `feature_names` setting); `check(manifest)` may refuse the manifest (raise) before the model is
    built."""
    directory = Path(directory)
    manifest = Manifest.read_for(directory, cls.name)
    if check is not None:
        check(manifest)
    model = from_settings(cls, manifest.settings)
    names = model.feature_names if feature_names is None else feature_names
    model.booster_ = load_booster(directory, manifest, names, cls.name)
    model.calibration_ = IntervalCalibration.from_json(manifest.normalisation["interval"])
    model.training_hash_ = manifest.training_data_hash
    model.n_samples_ = manifest.training_samples
    model.metrics_ = dict(manifest.metrics)
    return model, manifest


def from_settings(cls, settings: dict):
    """An unfitted estimator with a manifest's saved settings."""
    try:
        return cls(**settings)
    except TypeError as exc:
        raise PerfmodelError(f"manifest settings do not fit {cls.__name__}: {exc}") from None


def training_hash(samples: Sequence[Sample]) -> str:
    """Identity of the training data: each sample's job key and profile id."""
    return data_hash(f"{s.spec.key()}:{s.profile_id}" for s in samples)


def measured_ms(samples: Sequence[Sample]) -> np.ndarray:
    times = [s.iter_time_ms for s in samples]
    if any(t is None or not t > 0 for t in times):
        raise PerfmodelError("every training sample needs a measured iteration time > 0")
    return np.asarray(times, dtype=np.float64)


def family_folds(families: Sequence[str], k: int) -> list[np.ndarray]:
    """Test indices of up to `k` folds where no family is in two folds: families sorted by name, then each given
    to the fold with the fewest samples so far (deterministic). With one family, folds split its samples."""
    groups = sorted(set(families))
    if len(groups) < 2:
        groups_of = [str(i) for i in range(len(families))]
        groups = sorted(set(groups_of), key=int)
    else:
        groups_of = list(families)
    k = max(2, min(k, len(groups)))
    sizes = {g: 0 for g in groups}
    for g in groups_of:
        sizes[g] += 1
    fold_of: dict[str, int] = {}
    load = [0] * k
    for g in sorted(groups, key=lambda g: (-sizes[g], g)):
        fold = min(range(k), key=lambda f: (load[f], f))
        fold_of[g] = fold
        load[fold] += sizes[g]
    index = np.asarray([fold_of[g] for g in groups_of])
    return [np.flatnonzero(index == f) for f in range(k) if np.any(index == f)]


@dataclass(frozen=True)
class IntervalCalibration:
    """Multiplicative bounds around the iteration prediction, from out-of-fold residuals within the training set
    (split-conformal style): lower = base_lower × exp(lower_log), upper = base_upper × exp(upper_log), where
    lower_log is the `alpha_low` quantile of log(measured / base_lower) and upper_log the `alpha_high` quantile of
    log(measured / base_upper). The bases are the median (xgb-ops) or the booster's own p10/p90 (xgb-graph)."""

    lower_log: float
    upper_log: float
    alpha_low: float
    alpha_high: float
    oof_samples: int

    @classmethod
    def fit(cls, measured: np.ndarray, base_lower: np.ndarray, base_upper: np.ndarray, alpha_low: float,
            alpha_high: float) -> IntervalCalibration:
        lower = np.log(measured / base_lower)
        upper = np.log(measured / base_upper)
        return cls(lower_log=float(np.quantile(lower, alpha_low)), upper_log=float(np.quantile(upper, alpha_high)),
                   alpha_low=alpha_low, alpha_high=alpha_high, oof_samples=len(measured))

    def apply(self, median: np.ndarray, base_lower: np.ndarray, base_upper: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """(p_low, p_high), always bracketing the median."""
        low = np.minimum(base_lower * np.exp(self.lower_log), median)
        high = np.maximum(base_upper * np.exp(self.upper_log), median)
        return low, high

    def to_json(self) -> dict:
        return {"method": "split-conformal on inner family-fold out-of-fold predictions",
                "lower_log": self.lower_log, "upper_log": self.upper_log, "alpha_low": self.alpha_low,
                "alpha_high": self.alpha_high, "oof_samples": self.oof_samples}

    @classmethod
    def from_json(cls, data: dict) -> IntervalCalibration:
        return cls(lower_log=float(data["lower_log"]), upper_log=float(data["upper_log"]),
                   alpha_low=float(data["alpha_low"]), alpha_high=float(data["alpha_high"]),
                   oof_samples=int(data["oof_samples"]))


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a·x − b|| subject to x ≥ 0, exactly, for a few columns: the best of the unconstrained least
    squares solutions over every subset of columns that come out non-negative (2^columns small solves)."""
    n_cols = a.shape[1]
    best, best_cost = np.zeros(n_cols), float(np.sum(b**2))
    for size in range(1, n_cols + 1):
        for subset in itertools.combinations(range(n_cols), size):
            cols = list(subset)
            x_sub, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(x_sub < 0):
                continue
            x = np.zeros(n_cols)
            x[cols] = x_sub
            cost = float(np.sum((a @ x - b) ** 2))
            if cost < best_cost - 1e-12 * max(best_cost, 1.0):
                best, best_cost = x, cost
    return best


def iteration_metrics(measured: np.ndarray, predicted: np.ndarray, low: np.ndarray | None = None,
                      high: np.ndarray | None = None) -> dict[str, float]:
    ape = np.abs(predicted - measured) / measured
    metrics = {"mape": float(np.mean(ape)), "median_ape": float(np.median(ape)),
               "p90_ape": float(np.quantile(ape, 0.9))}
    if low is not None and high is not None:
        metrics["interval_coverage"] = float(np.mean((measured >= low) & (measured <= high)))
    return metrics

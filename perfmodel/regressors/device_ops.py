"""xgb-device-ops: per-op latency on any catalog accelerator, learned from public GPU measurements.

Input: a DataFrame of ops (the shape columns of `perfmodel.features.device_ops`, `op_class`, `op_name`, `dtype`,
`device` = a catalog id); `fit` also needs `latency_ms`. One XGBoost booster per op class
(`perfmodel.features.device_ops.OP_CLASSES`), squared error on a log target.

- Features: `TRANSFER_FEATURES`, the device-op features without the ones that describe the device itself
  (`DEVICE_IDENTITY_FEATURES`): the op's shape and work, and its roofline and wave-quantised compute time, intensity
  over ridge point and working set over L2 *on that device*, and `rocm` (the software stack). With a handful of
  training GPUs, trees that split on a device's peak or SM count only learn which GPU a row came from; ratios to
  the device's spec transfer. Each class's booster leaves out its `EXCLUDED_FEATURES` (saved as its feature names).
- Target: log(latency) − log(base + `floor_ms`), base = max(wave-quantised compute time, memory time), `floor_ms`
  80 µs (`FLOOR_MS`): the booster learns the efficiency the op reaches, the spec sheet gives the scale. Each booster
  is monotone in the features that move with the bandwidth (`BANDWIDTH_MONOTONE`), so less bandwidth never prices a
  kernel faster (models saved before, without `monotone_constraints` in their domain, carry no such guarantee).
- Interval (`quantiles`, default 10 / 90 %): quantiles of the log residuals of an inner leave-one-device-out fit
  (smaller boosters on at most `calibration_rows` rows per class), so its width is the error on a device the model
  did not see, not the training fit's. (XGBoost's multi-quantile objective was 30× slower to fit on these rows.)
- Bound: for `ROOFLINE_BOUNDED` classes the median is never below the roofline time max(FLOPs / peak,
  bytes / bandwidth) on that device, the FLOPs of the least arithmetic a library may run the op with
  (`roofline_bound_ms`; trees fitted on other GPUs can otherwise extrapolate past a new GPU's peak).
- `extrapolated`: the row's dtype was never trained on for its op class, or its device's peak or bandwidth lies
  outside the training devices' range. Such rows get their interval widened by `EXTRAPOLATION_WIDEN`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

import numpy as np
import pandas as pd

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.renamed import upgrade_names
from perfmodel.features.device_ops import DEVICE_IDENTITY_FEATURES, DEVICE_OP_FEATURES, device_op_features
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.lowering.ops import (
    GEMM_CLASSES,
    LIBRARY,
    OP_CLASSES,
    VECTOR_CLASSES,
    least_arithmetic,
    row_architectures,
    row_maths,
)
from perfmodel.regressors._xgb import read_booster
from perfmodel.regressors.manifest import Manifest, data_hash


def _predict(booster, x: np.ndarray, nthread: int) -> np.ndarray:
    """`x` holds the booster's own feature columns (`booster.feature_names`), in that order."""
    import xgboost as xgb

    if len(x) == 0:
        return np.zeros(0)
    return np.asarray(booster.predict(xgb.DMatrix(x, feature_names=booster.feature_names, nthread=nthread)),
                      dtype=np.float64)

TRANSFER_FEATURES = tuple(f for f in DEVICE_OP_FEATURES if f not in DEVICE_IDENTITY_FEATURES)
# features a class's booster leaves out, because across a handful of training GPUs they mostly say which GPU a
# row came from. GEMMs: working set over L2 (the training GPUs' L2 is 2-6 MB, an A100's 40 MB; trees fitted on it
# extrapolate a large-L2 GPU's big GEMMs past its peak; leaving it out costs memory-bound fp16 GEMMs a little) and
# `rocm` (one AMD GPU at most has GEMM rows, DeepBench's MI25: the flag would only name it).
# Memory-bound classes: the compute-side times and ratios (peak FLOP/s, tiles, waves), which do not bound them.
EXCLUDED_FEATURES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(GEMM_CLASSES, ("working_set_over_l2", "rocm")),
    **dict.fromkeys(VECTOR_CLASSES, ("intensity_over_ridge", "log_compute_ms", "log_roofline_ms", "waves",
                                     "log_tiles", "wave_tail", "log_wave_compute_ms", "tensor_math",
                                     "log_peak_per_watt")),
}


def class_features(op_class: str) -> tuple[str, ...]:
    """The `TRANSFER_FEATURES` the booster of `op_class` uses."""
    excluded = EXCLUDED_FEATURES.get(op_class, ())
    return tuple(f for f in TRANSFER_FEATURES if f not in excluded)

EXTRAPOLATION_WIDEN = 1.5  # interval half-widths (in log space) × this for extrapolated rows
# op classes whose predictions are bounded below by the roofline max(FLOPs / peak, bytes / bandwidth) of their
# math on that device (as NeuSight bounds its per-tile utilisation): every class. A convolution's FLOPs are those of
# the least arithmetic a library may run it with (`lowering.ops.least_arithmetic`: a fp32 3 x 3 stride-1 one as
# Winograd, 4x fewer multiplies than the direct convolution, which 16-37 % of such rows measured beat): a prediction
# never claims more than the peak of its math for the work it does.
ROOFLINE_BOUNDED = frozenset(OP_CLASSES)
# rows a library call launches back to back (`launch` `LIBRARY`: cuDNN's recurrent steps) cost this share of the
# same kernel launched alone from eager PyTorch, which is what the training rows timed: the median of DeepBench's
# recurrent layers (LSTM, GRU, vanilla; forward and backward through the data; 1,108 layers on seven NVIDIA GPUs)
# over their kernels as priced eager is 1.46, and held out by GPU the fitted share stays within 0.64-0.71
# (`bench/rnn_layers.py --fit`; with a training step's half-precision bound on the fp16 layers, 0.66 and 0.63-0.68;
# with v4's bandwidth-monotone boosters 0.65 and 0.61-0.67, v5's 0.66 and 0.62-0.69: 0.68 is kept). Per vendor:
# MIOpen's layers on two AMD GPUs are within 1.05-1.10x of their eager price, and keep it.
LIBRARY_LAUNCH_SHARE: dict[str, float] = {"NVIDIA": 0.68}
DOMAIN_FILE = "op_domain.json"
# A memory-bound kernel in a narrower type moves fewer bytes for the same elements and math: it is never priced above
# the same kernel in fp32. The rows of each type come from different sources (fp32 mostly NeuSight's sweeps, half
# types serving traces), and trees fitted on them put 1.7 % of random fp16 element-wise, softmax and norm kernels on
# catalog GPUs above their fp32 twin, the worst 1.6x (0.4 %, 2.0x, once vidur's activation rows were named by the
# work they do).
NARROW_NEVER_DEARER = frozenset(VECTOR_CLASSES)
NARROW_DTYPES = frozenset({"fp16", "bf16", "fp8"})


def roofline_bound_ms(ops: pd.DataFrame, features: pd.DataFrame, architectures: np.ndarray) -> np.ndarray:
    """The least time of every row (`ops`, its `device_op_features` and its device's architecture): its compute at
    the peak of its math for the least arithmetic a library may run it with, or its bytes at the bandwidth, whichever
    is longer."""
    compute_ms = np.exp2(features["log_compute_ms"].to_numpy()) * least_arithmetic(ops, architectures)
    return np.maximum(compute_ms, np.exp2(features["log_memory_ms"].to_numpy()))


def _booster_file(op_class: str) -> str:
    return f"model-{op_class}.ubj"  # XGBoost's binary JSON (UBJSON): a third of the size of its text JSON


def library_launch_log_share(ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> np.ndarray:
    """log(`LIBRARY_LAUNCH_SHARE`) of every row a library launches on a device of a listed vendor, else 0 (rows
    without a `launch` column are eager)."""
    out = np.zeros(len(ops))
    if "launch" not in ops or not len(ops):
        return out
    library = (ops["launch"] == LIBRARY).to_numpy()
    if library.any():
        vendor = ops.loc[library, "device"].map(lambda d: catalog[d].vendor if d in catalog else "")
        out[library] = np.log(vendor.map(LIBRARY_LAUNCH_SHARE).fillna(1.0).to_numpy(dtype=np.float64))
    return out


def base_ms(features: pd.DataFrame) -> np.ndarray:
    """max(wave-quantised compute time, memory time) of every row, ms."""
    return np.maximum(np.exp2(features["log_wave_compute_ms"].to_numpy()),
                      np.exp2(features["log_memory_ms"].to_numpy()))


# Less memory bandwidth never prices a kernel faster, by construction: the target's normalisation (`base_ms`) only
# grows as the bandwidth falls, and every booster is constrained monotone in each feature that moves with the
# bandwidth (`BANDWIDTH_MONOTONE`: more memory time or a higher roofline never faster, more intensity over the ridge
# point never slower), so every term moves the answer the same way when the bandwidth falls. Unconstrained
# (`xgb-device-ops/v3`), the trees learned an efficiency that fell faster than the memory time grew: 43 % of the
# element-wise kernels of four zoo jobs on ten GPUs got cheaper for some bandwidth cut (up to 4.4x), GEMMs and
# convolutions up to 1.3x.
BANDWIDTH_MONOTONE: dict[str, int] = {"log_memory_ms": 1, "log_roofline_ms": 1, "intensity_over_ridge": -1}
# The time added to the roofline time in the target's normalisation: at least the per-op overhead of the training
# rows (NeuSight's eager fp32 ops carry 25-65 µs), so that the efficiency the trees learn grows with the memory time
# as the constraint requires (log((memory + overhead) / (memory + floor)) rises with the memory time only where the
# floor is the larger). Held out by GPU (fp32 NeuSight rows), element-wise / layer norm / softmax MAPE was 28.6 / 19.9
# / 35.5 % at 5 µs (v3's floor), 20.7 / 15.8 / 26.4 % at 40 µs and 18.7 / 14.6 / 25.0 % at 80 µs (v3, without the
# constraint: 17.5 / 13.5 / 16.7 %); GEMM classes within a point of v3 at each. Chosen by looking at those figures.
FLOOR_MS = 0.08


def monotone_constraints(features: Sequence[str]) -> str:
    """XGBoost's `monotone_constraints` of a booster over `features` (`BANDWIDTH_MONOTONE`)."""
    return "(" + ",".join(str(BANDWIDTH_MONOTONE.get(f, 0)) for f in features) + ")"


@dataclass(frozen=True)
class OpPrediction:
    """Per-row predictions, aligned with the input DataFrame."""

    latency_ms: np.ndarray
    p10_ms: np.ndarray
    p90_ms: np.ndarray
    extrapolated: np.ndarray  # bool

    def frame(self, index: pd.Index | None = None) -> pd.DataFrame:
        return pd.DataFrame({"predicted_ms": self.latency_ms, "p10_ms": self.p10_ms, "p90_ms": self.p90_ms,
                             "extrapolated": self.extrapolated}, index=index)


class OpLatencyModel(Protocol):
    """What prices kernel rows: `DeviceOpRegressor`, or one adapted to a device (`regressors.adaptation`)."""

    def predict(self, ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> OpPrediction: ...

    def measured_kernels(self, ops: pd.DataFrame) -> np.ndarray:
        """Which rows are priced from measurements of their own kernel on their device (a depthwise convolution's
        gradient the device's op sweep timed as itself), where no bound from a library's choice of algorithm
        applies."""
        ...


class DeviceOpRegressor:
    name = "xgb-device-ops"
    training_hash_: str | None  # None when loaded from a manifest that has none

    def __init__(self, n_estimators: int = 250, max_depth: int = 6, learning_rate: float = 0.08,
                 min_child_weight: float = 1.0, subsample: float = 0.8, floor_ms: float = FLOOR_MS, seed: int = 0,
                 quantiles: Sequence[float] = (0.1, 0.9), max_rows_per_class: int = 60000,
                 calibration_rows: int = 8000, nthread: int = 2, exclude_features: Sequence[str] = ()):
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.min_child_weight = min_child_weight
        self.subsample = subsample
        self.floor_ms = floor_ms
        self.seed = seed
        self.quantiles = quantiles
        self.max_rows_per_class = max_rows_per_class
        self.calibration_rows = calibration_rows
        self.nthread = nthread
        self.exclude_features = exclude_features  # left out of every class's booster, besides EXCLUDED_FEATURES

    def get_params(self) -> dict:
        return {name: (list(value) if name in ("quantiles", "exclude_features") else value)
                for name, value in vars(self).items() if not name.endswith("_")}

    def _booster_params(self) -> dict:
        return {"objective": "reg:squarederror", "tree_method": "hist", "max_depth": self.max_depth,
                "eta": self.learning_rate, "min_child_weight": self.min_child_weight, "subsample": self.subsample,
                "seed": self.seed, "nthread": self.nthread}

    def _residual_quantiles(self, x: np.ndarray, y: np.ndarray, devices: np.ndarray, params: dict,
                            features: tuple[str, ...]) -> list[float]:
        """Quantiles of log(measured / predicted) over an inner leave-one-device-out fit (pooled residuals of
        every held-out device); with one device, of the training residuals."""
        from perfmodel.regressors._xgb import train_booster

        rng = np.random.default_rng(self.seed)
        if len(y) > self.calibration_rows:
            keep = rng.choice(len(y), self.calibration_rows, replace=False)
            x, y, devices = x[keep], y[keep], devices[keep]
        residuals = []
        rounds = max(self.n_estimators // 3, 10)
        groups = sorted(set(devices))
        for device in groups if len(groups) > 1 else [None]:
            test = devices == device if device is not None else np.ones(len(y), dtype=bool)
            train = ~test if device is not None else test
            booster = train_booster(x[train], y[train], features, params, rounds)
            residuals.append(y[test] - _predict(booster, x[test], self.nthread))
        pooled = np.concatenate(residuals)
        return [float(np.quantile(pooled, q)) for q in self.quantiles]

    def fit(self, ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> DeviceOpRegressor:
        from perfmodel.regressors._xgb import train_booster

        ops = ops[ops["op_class"].isin(OP_CLASSES)]
        if ops.empty:
            raise PerfmodelError(f"no training rows of the op classes {OP_CLASSES}")
        if (ops["latency_ms"] <= 0).any() or ops["latency_ms"].isna().any():
            raise PerfmodelError("training rows need a positive latency_ms")
        self.boosters_: dict = {}
        self.domain_: dict = {"op_classes": {}}
        params = self._booster_params()
        for op_class, rows in ops.groupby("op_class"):
            if len(rows) > self.max_rows_per_class:
                rows = rows.sample(n=self.max_rows_per_class, random_state=self.seed)
            features = device_op_features(rows, catalog)
            target = np.log(rows["latency_ms"].to_numpy()) - np.log(base_ms(features) + self.floor_ms)
            names = tuple(f for f in class_features(str(op_class)) if f not in self.exclude_features)
            x = features[list(names)].to_numpy()
            class_params = {**params, "monotone_constraints": monotone_constraints(names)}
            self.boosters_[op_class] = train_booster(x, target, names, class_params, self.n_estimators)
            residual_quantiles = self._residual_quantiles(x, target, rows["device"].to_numpy(), class_params, names)
            devices = [catalog[d] for d in sorted(set(rows["device"]))]
            self.domain_["op_classes"][op_class] = {
                "dtypes": sorted(set(rows.get("dtype", pd.Series(["fp32"])))),
                "maths": sorted(set(row_maths(rows))),
                "devices": [d.name for d in devices],
                "peak_fp32_gflops": [min(d.peak_fp32_gflops for d in devices),
                                     max(d.peak_fp32_gflops for d in devices)],
                "memory_bandwidth_gb_s": [min(d.memory_bandwidth_gb_s for d in devices),
                                          max(d.memory_bandwidth_gb_s for d in devices)],
                "rows": int(len(rows)),
                "log_residual_quantiles": residual_quantiles,
                "monotone_constraints": dict(BANDWIDTH_MONOTONE),
            }
        # rows per device, op class, op and dtype: a row renamed (the work it does) changes the hash, so an adaptation
        # fitted on another model is never taken for this one's. pandas-stubs type a group key Hashable: a 4-tuple
        keys = [k for k in ("device", "op_class", "op_name", "dtype") if k in ops]
        sizes = cast("dict[tuple[str, ...], int]", ops.groupby(keys).size().to_dict())
        self.training_hash_ = data_hash(":".join(map(str, (*key, n))) for key, n in sizes.items())
        return self

    def _extrapolated(self, ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> np.ndarray:
        out = np.zeros(len(ops), dtype=bool)
        for i, (op_class, math, device) in enumerate(zip(ops["op_class"], row_maths(ops), ops["device"])):
            domain = self.domain_["op_classes"][op_class]
            spec = catalog[device]
            lo_peak, hi_peak = domain["peak_fp32_gflops"]
            lo_bw, hi_bw = upgrade_names(domain)["memory_bandwidth_gb_s"]
            out[i] = (math not in domain.get("maths", domain["dtypes"])
                      or not lo_peak <= spec.peak_fp32_gflops <= hi_peak
                      or not lo_bw <= spec.memory_bandwidth_gb_s <= hi_bw)
        return out

    def measured_kernels(self, ops: pd.DataFrame) -> np.ndarray:
        """None: this model prices every row from other devices' and shapes' measurements (`OpLatencyModel`)."""
        return np.zeros(len(ops), dtype=bool)

    def predict(self, ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> OpPrediction:
        """Latency of every row (op classes this model was fitted on), a memory-bound row in a narrower type never
        above the same row in fp32 (`NARROW_NEVER_DEARER`); no side effects."""
        narrow = np.zeros(len(ops), dtype=bool)
        if len(ops) and "dtype" in ops:
            narrow = (ops["op_class"].isin(NARROW_NEVER_DEARER) & ops["dtype"].isin(NARROW_DTYPES)).to_numpy()
        if not narrow.any():
            return self._predict_bounded(ops, catalog)
        n = len(ops)
        twins = ops[narrow].assign(dtype="fp32", **({"math": "fp32"} if "math" in ops else {}))
        both = self._predict_bounded(pd.concat([ops, twins], ignore_index=True), catalog)
        scale = np.ones(n)
        scale[narrow] = np.minimum(both.latency_ms[n:] / both.latency_ms[:n][narrow], 1.0)
        return OpPrediction(both.latency_ms[:n] * scale, both.p10_ms[:n] * scale, both.p90_ms[:n] * scale,
                            both.extrapolated[:n])

    def _predict_bounded(self, ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> OpPrediction:
        if not hasattr(self, "boosters_"):
            raise PerfmodelError("xgb-device-ops is not fitted: call fit(ops, catalog) or load(directory) first")
        unknown = sorted(set(ops["op_class"]) - set(self.boosters_))
        if unknown:
            raise PerfmodelError(f"this model has no booster for op class(es) {unknown}; "
                                 f"it knows {sorted(self.boosters_)}")
        n = len(ops)
        median, low, high = np.zeros(n), np.zeros(n), np.zeros(n)
        positions = np.arange(n)
        features = device_op_features(ops, catalog) if n else None
        launched = library_launch_log_share(ops, catalog)
        architectures = row_architectures(ops, catalog)
        for op_class, booster in self.boosters_.items():
            mask = (ops["op_class"] == op_class).to_numpy()
            if not mask.any():
                continue
            assert features is not None  # n > 0 here
            rows = features[mask]
            log_ms = _predict(booster, rows[list(booster.feature_names)].to_numpy(), self.nthread)
            log_ms = log_ms + np.log(base_ms(rows) + self.floor_ms) + launched[mask]
            if op_class in ROOFLINE_BOUNDED:  # a held-out device's trees can extrapolate past its peak
                log_ms = np.maximum(log_ms, np.log(roofline_bound_ms(ops[mask], rows, architectures[mask])))
            q_low, q_high = self.domain_["op_classes"][op_class]["log_residual_quantiles"]
            idx = positions[mask]
            median[idx] = log_ms
            low[idx] = log_ms + min(q_low, 0.0)
            high[idx] = log_ms + max(q_high, 0.0)
        extrapolated = self._extrapolated(ops, catalog) if n else np.zeros(0, dtype=bool)
        widen = np.where(extrapolated, EXTRAPOLATION_WIDEN, 1.0)
        low = median - (median - low) * widen
        high = median + (high - median) * widen
        return OpPrediction(np.exp(median), np.exp(low), np.exp(high), extrapolated)

    def save(self, directory: str | Path, metrics: dict | None = None) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        artifacts = []
        for op_class, booster in self.boosters_.items():
            booster.save_model(str(directory / _booster_file(op_class)))
            artifacts.append(_booster_file(op_class))
        (directory / DOMAIN_FILE).write_text(json.dumps(self.domain_, indent=2) + "\n")
        manifest = Manifest(regressor=self.name, feature_names=TRANSFER_FEATURES,
                            normalisation={"target": "log(latency_ms) - log(base_ms + floor_ms)",
                                           "monotone_constraints": dict(BANDWIDTH_MONOTONE)},
                            settings=self.get_params(), artifacts=(*artifacts, DOMAIN_FILE),
                            training_data_hash=self.training_hash_,
                            training_samples=sum(c["rows"] for c in self.domain_["op_classes"].values()),
                            metrics=metrics or {})
        return manifest.write(directory)

    @classmethod
    def load(cls, directory: str | Path) -> DeviceOpRegressor:
        directory = Path(directory)
        manifest = Manifest.read_for(directory, cls.name)
        unknown = sorted(set(manifest.feature_names) - set(TRANSFER_FEATURES))
        if unknown:  # each booster keeps its own feature names: a model fitted on fewer features still loads
            raise PerfmodelError(f"model expects features this perfmodel does not compute: {unknown[:8]}")
        model = cls(**manifest.settings)
        model.domain_ = json.loads((directory / DOMAIN_FILE).read_text())
        model.boosters_ = {}
        for op_class in model.domain_["op_classes"]:
            model.boosters_[op_class] = read_booster(directory / _booster_file(op_class))
        model.training_hash_ = manifest.training_data_hash
        return model

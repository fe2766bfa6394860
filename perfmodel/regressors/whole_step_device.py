"""device-whole-step: the whole-step stage as a device effect and a per-model level, learned from real runs.

Real training steps differ from the composed kernel sum in ways that real runs can separate:

- **the model's own level**: how much slower (or faster) than composed a model's whole step runs, whatever the
  GPU. It varies most (on the public runs from 0.79x for Tacotron 2 in TF32 and 0.84x for Transformer-XL in AMP to
  1.2-1.3x for GNMT and WaveGlow in TF32) and nothing in a graph's features predicts it for a model family never
  measured (the learned stages that tried made unseen families worse);
- **the device effect**: how the ratio moves from GPU to GPU for the same model and math. It follows the die's
  spec sheet: GPUs with more tensor FLOP/s, and more of them per watt of board power, run further from the kernel
  model. Memory is not in it: the kernel model prices bandwidth kernel by kernel, and a whole-step factor that grew
  with bandwidth or capacity would speed up the compute-bound part of a step on a part with more memory. The runs'
  only SKUs of one die that differ in memory (A100 40 GB against 80 GB) gain less than composed, not more, so two
  such SKUs get the same device effect;
- **the convolution math effect**: how much of the step is 2-D convolution in a math no kernel measurement covers
  (`CONV_MATH_FEATURES`: TF32, slower than the kernel model's fp16-learned efficiency; fp32 3 x 3, which cuDNN
  runs as Winograd, faster). It moves the ratio within one level: a model's TF32 level holds its TF32 steps on
  Ampere and its fp32 steps on older GPUs (on the public runs, 1-GPU MAPE held out by family 20.7 % with it and
  24.9 % without (`device-whole-step/v12`), by chip 18.2 % and 22.1 %; only 2-D convolutions count, a choice made
  looking at those figures). A model never measured pays for its TF32 share and counts its fp32 3 x 3 share as
  none (`SEEN_ONLY_FEATURES`).

- **the software it ran on**: the same GPU, model and math run faster in a newer container (PyTorch, cuDNN,
  cuBLAS, the example's own code). On the public runs, against PyTorch 1.13 (NGC 22.09) on the GPUs measured on
  both: 1.4 (NGC 20.01) 22 % slower, 1.7-1.9 (20.10-21.03) 6-8 %, 1.10 (21.07) under 1 %. Left in, it would read as a
  device effect (the Volta and Turing parts ran mostly on 1.4) and each level would be an old container's.
  `fit(..., software=, devices=)` takes each older version's offset (`software_offsets`: paired on the same GPU,
  model and math) off its rows first, so the stage learns, and answers, the newest software's step;
  `software_offset` gives the offset back for judging a run on the version it ran on.

So: log(measured / composed) = level[model, math] + w · clip(features - their mean), with w a ridge regression on
the device and convolution math features (`STAGE_FEATURES`, named columns of `COMPOSITION_FEATURES`) of every run
less its (model, math) level, and each level the median of what the effect leaves. A job whose zoo model and math
were measured gets its level; any other job gets no level of its own (the composed step is right on the average GPU of
the data), the device effect, and what being AMP costs: the weight of `amp` in a second fit over `UNSEEN_FEATURES`
with one level per model (not per model and math), so that the AMP and TF32 runs of each measured model tell it (a
TF32 step pays nothing for AMP). The fit with a level per model and math gives `amp` no weight: it is the same on
every run of a level, so any weight there would be arbitrary (`PER_JOB_FEATURES`). A GPU above the range the runs
cover (a newer generation) gets the effect of the newest measured ones, not an extrapolated line, and the effect as a
whole stays within what the measured GPUs got (each feature inside its range, a mix no measured GPU had can still
add up past them); one below it on any feature (older or smaller than every measured GPU) gets no device effect
(nor convolution math effect); a feature its spec sheet lacks (no TDP: no FLOP/s per watt) counts as the average
GPU's (the predictor fills a missing TDP first, as the per-op model's features do: from another SKU of the die, else
the nearest device). Gavel's 2019 runs on the P100 and K80 (below the range: less FLOP/s per watt than every
measured GPU) bear the "no effect" out: given the nearest measured GPUs' effect instead (features clipped up to the
range), their one-GPU answers went from 23 % to 66 % MAPE (P100) and from 62 % to 137 % (K80), all too fast
(`bench/gavel.py` with that rule patched in; not kept). The same runs cannot say whether Gavel's scripts get the
effect on a GPU inside the range (a V100): none of theirs ran there.

The 80 % band is conformal on out-of-fold residuals: for a job without a level, of folds that hold out whole model
families (the band of a family never seen); for a job with one, of folds that hold out GPUs. A GPU outside the
measured range on any device feature adds the GPU folds' band in quadrature (`_outside`).

scikit-learn contract (`__init__` stores settings, `fit` returns self, `predict` has no side effect); saved as
`stage.json` (weights, centre, range, levels, bands) and `manifest.json` (feature names in order, settings, data
hash, metrics; the software offsets in both): no pickle.
`predict(frame)` reads the feature columns and, when present, the `job` column (`job_level_key`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.core.errors import PerfmodelError
from perfmodel.regressors.manifest import Manifest, data_hash
from perfmodel.regressors.whole_step import TARGET, StepCorrection

DEVICE_FEATURES: tuple[str, ...] = ("log_peak_tensor_tflops", "log_peak_per_watt", "amp")
# how much of the step is convolution in a math no kernel measurement covers (TF32, and fp32 Winograd-eligible:
# `perfmodel.predictor.composition.conv_math_masks`): they move the ratio within one model and math (a TF32
# level holds both an A100's TF32 steps and a V100's fp32 ones), so every job's correction weighs them
CONV_MATH_FEATURES: tuple[str, ...] = ("share_conv_tf32", "share_conv_winograd")
STAGE_FEATURES: tuple[str, ...] = (*DEVICE_FEATURES, *CONV_MATH_FEATURES)
# a model never measured: the stage's features, whose `amp` the fit with one level per model weighs. How much of
# the step is half-precision convolution (`share_conv_amp`) is not one of them: learned from SSD (AMP faster against
# composed than its TF32) against Mask R-CNN (slower), it credited every AMP CNN never measured, and without it
# the held-out figures were better on every source (`device-whole-step/v20` had it)
UNSEEN_FEATURES: tuple[str, ...] = STAGE_FEATURES
# features a model never measured counts as 0: the fp32 3 x 3 share (`share_conv_winograd`). With a level per model
# and math, only its contrast with `share_conv_tf32` is learned (a CNN's TF32 level holds its fp32 steps on GPUs
# without TF32), from SSD and Mask R-CNN in NVIDIA's containers, whose fp32 steps on Volta, Turing and Pascal ran
# faster against that level; the measured models keep it. As a credit for a model never measured, every CNN measured
# elsewhere contradicts it: Gavel's ResNet-18, ResNet-50 and CycleGAN on the P100, and Pollux's ResNet-18 on a T4
# (cuDNN's autotuner on, in NVIDIA's 20.03 container), answered at or faster than measured without it
SEEN_ONLY_FEATURES: tuple[str, ...] = ("share_conv_winograd",)
# device features that are the same on every run of a (model, math) level: the levels absorb them, so the fit with
# levels gives them no weight (any weight there would be arbitrary), and a model never measured takes theirs from
# the fit with one level per model, where each model's AMP runs against its TF32 runs tell it
PER_JOB_FEATURES: frozenset[str] = frozenset({"amp"})
JOB = "job"  # the optional column naming a row's (zoo model, math): `job_level_key`
MIN_SOFTWARE_PAIRS = 3  # (GPU, model and math) measured on both versions for a version's offset; fewer: none
BACKFIT_ROUNDS = 20  # alternating fits of the weights and the levels (converged well before)
RANGE_TOLERANCE = 0.05  # log2 units a feature may sit below the measured range and still count as inside it


def job_level_key(model: str | None, precision: str) -> str | None:
    """The key a model's level is kept under: its zoo name and math (None: not a zoo model, no level)."""
    return None if not model else f"{model}:{precision}"


def model_of(job: str) -> str:
    """The model part of a level key (`job_level_key`): the key without its math."""
    return str(job).rsplit(":", 1)[0]


def version_key(version: str) -> tuple[int, ...]:
    """A version string as numbers, for ordering ("1.13" after "1.4")."""
    return tuple(int(part) if part.isdigit() else 0 for part in version.split("."))


def software_offsets(y: np.ndarray, software: Sequence[str], devices: Sequence[str],
                     jobs: Sequence[str]) -> tuple[str, dict[str, float]]:
    """(the newest software version of the rows, {each older version: its log offset against the newest}).

    An offset is what the same GPU, model and math lose on that version: the median, over the (GPU, level key)
    measured on both, of the difference of their median `y` (log of measured over composed: the composition
    accounts for their batches differing). A version with fewer than `MIN_SOFTWARE_PAIRS` such pairs gets none;
    rows of unknown version ("") are neither used nor corrected."""
    known = [v for v in software if v]
    versions = sorted(set(known), key=version_key)
    if len(versions) < 2:
        return (versions[-1] if versions else ""), {}
    reference = versions[-1]
    table = pd.DataFrame({"y": y, "version": list(software), "device": list(devices), "job": list(jobs)})
    medians = table[table.version != ""].groupby(["device", "job", "version"]).y.median().unstack()
    offsets = {}
    for version in versions[:-1]:
        paired = (medians[version] - medians[reference]).dropna()
        offsets[version] = float(paired.median()) if len(paired) >= MIN_SOFTWARE_PAIRS else 0.0
    return reference, offsets


def _folds(labels: Sequence[str]) -> list[np.ndarray]:
    values = np.asarray(labels, dtype=object)
    return [np.flatnonzero(values == label) for label in sorted(set(values))]


class DeviceStepRegressor:
    name = "device-whole-step"

    def __init__(self, feature_names: Sequence[str] = STAGE_FEATURES, ridge: float = 3.0,
                 quantiles: tuple[float, float] = (0.1, 0.9), unseen_features: Sequence[str] | None = UNSEEN_FEATURES,
                 seen_only: Sequence[str] = SEEN_ONLY_FEATURES):
        self.feature_names = tuple(feature_names)
        self.ridge = ridge
        self.quantiles = tuple(quantiles)
        self.unseen_features = None if unseen_features is None else tuple(unseen_features)
        self.seen_only = tuple(seen_only)

    def get_params(self) -> dict[str, Any]:
        return {"feature_names": list(self.feature_names), "ridge": self.ridge, "quantiles": list(self.quantiles),
                "unseen_features": None if self.unseen_features is None else list(self.unseen_features),
                "seen_only": list(self.seen_only)}

    @property
    def _unseen_names(self) -> tuple[str, ...]:
        return self.unseen_features if self.unseen_features is not None else self.feature_names

    # --- the fit ------------------------------------------------------------------------------------------------

    @staticmethod
    def _x(frame: pd.DataFrame, names: Sequence[str]) -> np.ndarray:
        missing = [name for name in names if name not in frame]
        if missing:
            raise PerfmodelError(f"whole-step features missing: {missing}")
        return frame[list(names)].to_numpy(dtype=np.float64)

    def _solve(self, x: np.ndarray, y: np.ndarray, jobs: np.ndarray,
               without: Sequence[bool] | None = None) -> dict[str, Any]:
        """Weights, centre, range and levels fitted on (x, y, jobs); the columns flagged in `without` get no
        weight."""
        if not np.isfinite(x).any(axis=0).all():
            raise PerfmodelError("every device feature needs a value on at least one run")
        low, high, mean = np.nanmin(x, axis=0), np.nanmax(x, axis=0), np.nanmean(x, axis=0)
        levels = pd.Series(y).groupby(jobs).transform("median").to_numpy()
        xc = np.nan_to_num(x - mean)  # a feature the spec sheet lacks counts as the average GPU's
        if without is not None:
            xc[:, np.asarray(without, dtype=bool)] = 0.0
        scale = xc.std(axis=0) + 1e-9
        xs = xc / scale
        ridge = self.ridge * len(xs) / 100.0 * np.eye(xs.shape[1])
        for _ in range(BACKFIT_ROUNDS):  # weights on what the levels leave, levels on what the weights leave
            r = y - levels
            w = np.linalg.solve(xs.T @ xs + ridge, xs.T @ (r - r.mean()))
            effect = xs @ w
            levels = pd.Series(y - effect).groupby(jobs).transform("median").to_numpy()
        by_job = pd.Series(y - effect).groupby(jobs).median()
        return {"weights": (w / scale).tolist(), "mean": mean.tolist(), "low": low.tolist(), "high": high.tolist(),
                "levels": {str(k): float(v) for k, v in by_job.items()},
                "effect_range": [float(effect.min()), float(effect.max())]}

    @staticmethod
    def _apply(params: dict[str, Any], x: np.ndarray, jobs: Sequence[Any] | None) -> tuple[np.ndarray, np.ndarray]:
        """(log factor, whether the row had a level) of rows `x` under `params`. Features above the measured range
        are clipped to it, and the effect to the measured GPUs' (`effect_range`, where the stage has one); a row
        below it on any feature (a GPU older or smaller than every measured one) gets no effect."""
        low, high = np.asarray(params["low"]), np.asarray(params["high"])
        below = np.any(np.nan_to_num(x, nan=np.inf) < low - RANGE_TOLERANCE, axis=1)
        clipped = np.clip(x, low, high)
        # row by row, the same sum whatever the number of rows (a matrix product rounds differently by shape)
        effect = (np.nan_to_num(clipped - np.asarray(params["mean"])) * np.asarray(params["weights"])).sum(axis=1)
        if "effect_range" in params:  # a stage saved before it was kept: features clipped one by one only
            effect = np.clip(effect, *params["effect_range"])
        effect[below] = 0.0
        levels: dict[str, float] = params["levels"]
        keys = [None if j is None or j != j else str(j) for j in (jobs if jobs is not None else [None] * len(x))]
        known = np.array([k is not None and k in levels for k in keys], dtype=bool)
        level = np.array([levels[k] if ok and k is not None else 0.0 for k, ok in zip(keys, known)])
        return effect + level, known

    def fit(self, frame: pd.DataFrame, groups: Sequence[str], jobs: Sequence[str] | None = None,
            chips: Sequence[str] | None = None, keys: Sequence[str] | None = None,
            software: Sequence[str] | None = None, devices: Sequence[str] | None = None) -> DeviceStepRegressor:
        """Learn from `frame` (the feature columns and `log_ratio`) of one-device runs. `groups`: each row's model
        family (the band of unseen models holds them out), `jobs`: its level key (`job_level_key`; default: its
        group), `chips`: its GPU's die (the band of seen models holds them out; default: its group); `keys`: each
        row's identity, for the data hash. `software` (with `devices`, each row's GPU): the version of the
        software each row ran on ("" unknown); each older version's offset (`software_offsets`) is taken off its
        rows first, so that the stage learns, and answers, the newest software's step."""
        if TARGET not in frame or len(frame) < 5:
            raise PerfmodelError(f"need at least 5 rows with a {TARGET!r} column to fit the whole-step stage")
        jobs = list(groups) if jobs is None else jobs
        chips = list(groups) if chips is None else chips
        if not len(groups) == len(jobs) == len(chips) == len(frame):
            raise PerfmodelError("groups, jobs and chips need one value per row")
        x, x_unseen = self._x(frame, self.feature_names), self._x(frame, self._unseen_names)
        y = frame[TARGET].to_numpy(dtype=np.float64)
        if not np.all(np.isfinite(y)):
            raise PerfmodelError(f"{TARGET} must be finite")
        jobs_ = np.asarray(jobs, dtype=object)
        self.software_: dict[str, Any] = {"reference": "", "offsets": {}}
        if software is not None:
            if devices is None or not len(software) == len(devices) == len(y):
                raise PerfmodelError("software needs devices, and both one value per row")
            reference, offsets = software_offsets(y, software, devices, list(jobs_))
            self.software_ = {"reference": reference, "offsets": offsets}
            y = y - self.software_offset(software)
        models = np.asarray([model_of(j) for j in jobs_], dtype=object)
        # a measured job: its own level (per model and math) and the device effect; a model never measured: the
        # device effect and what its extra features (`amp`, the unseen features that are per job) cost, learned with
        # one level per model so that the AMP and TF32 runs of one model tell what AMP costs
        self.params_ = self._solve(x, y, jobs_, self._per_job)
        self.extra_weights_ = self._extra_weights(x_unseen, y, models)
        bands: dict[str, list[float]] = {}
        metrics: dict[str, Any] = {"rows": int(len(y)), "jobs": len(set(jobs_)), "families": len(set(groups)),
                                   "composed_mape": float(np.mean(np.abs(np.exp(-y) - 1.0))),
                                   "software_reference": self.software_["reference"],
                                   "software_offsets": self.software_["offsets"]}
        for name, labels, seen in (("unseen", groups, False), ("seen", chips, True)):
            oof = np.full(len(y), np.nan)
            for test in _folds(labels):
                train = np.setdiff1d(np.arange(len(y)), test)
                if len(train) < 5:
                    continue
                if seen:
                    params = self._solve(x[train], y[train], jobs_[train], self._per_job)
                    oof[test] = self._apply(params, x[test], list(jobs_[test]))[0]
                else:
                    params = self._solve(x[train], y[train], jobs_[train], self._per_job)
                    extra = self._extra_weights(x_unseen[train], y[train], models[train])
                    oof[test] = self._unseen(params, extra, x[test], frame.iloc[test])
            ok = np.isfinite(oof)
            residual = y[ok] - oof[ok]
            bands[name] = [float(np.quantile(residual, q)) for q in self.quantiles] if ok.any() else [0.0, 0.0]
            metrics[f"oof_mape_{name}"] = float(np.mean(np.abs(np.exp(oof[ok] - y[ok]) - 1.0))) if ok.any() else None
        self.bands_ = bands
        self.metrics_ = metrics
        self.training_hash_ = data_hash(keys if keys is not None else map(str, range(len(y))))
        self.n_samples_ = len(y)
        return self

    # --- prediction -----------------------------------------------------------------------------------------------

    @property
    def _per_job(self) -> list[bool]:
        return [name in PER_JOB_FEATURES for name in self.feature_names]

    def _extra_weights(self, x_unseen: np.ndarray, y: np.ndarray, models: np.ndarray) -> dict[str, float]:
        """The weights of the features only unseen models use, and of those the levels absorb
        (`PER_JOB_FEATURES`), from a fit with one level per model."""
        weights = self._solve(x_unseen, y, models)["weights"]
        return {name: float(w) for name, w in zip(self._unseen_names, weights)
                if name not in self.feature_names or name in PER_JOB_FEATURES}

    def _unseen(self, params: dict[str, Any], extra: dict[str, float], x: np.ndarray,
                frame: pd.DataFrame) -> np.ndarray:
        """Log factors of models never measured: the device effect, with the `seen_only` features counted as 0, plus
        each extra feature times its weight (0 where the feature is 0: a TF32 step pays nothing for being AMP)."""
        none = [i for i, name in enumerate(self.feature_names) if name in self.seen_only]
        if none:
            x = x.copy()
            x[:, none] = 0.0
        effect = self._apply(params, x, None)[0]
        for name, weight in extra.items():
            effect = effect + weight * np.nan_to_num(self._x(frame, [name])[:, 0])
        return effect

    def _check_fitted(self) -> None:
        if not hasattr(self, "params_"):
            raise PerfmodelError("device-whole-step is not fitted: call fit(frame, ...) or load(directory) first")

    def predict(self, frame: pd.DataFrame) -> StepCorrection:
        """Log factors for every row of `frame` (the feature columns, and `job` where known); no side effects."""
        self._check_fitted()
        jobs = list(frame[JOB]) if JOB in frame else None
        x = self._x(frame, self.feature_names)
        factor, known = self._apply(self.params_, x, jobs)
        if not known.all():
            factor = np.where(known, factor, self._unseen(self.params_, self.extra_weights_, x, frame))
        low = np.where(known, self.bands_["seen"][0], self.bands_["unseen"][0])
        high = np.where(known, self.bands_["seen"][1], self.bands_["unseen"][1])
        # a GPU outside the measured ones on any device feature (a newer or older generation) adds what an unseen
        # GPU is off by (the band of folds that hold out chips) to the band, in quadrature: two errors, not one
        outside = self._outside(x)
        low = np.where(outside, -np.hypot(np.minimum(low, 0.0), min(self.bands_["seen"][0], 0.0)), low)
        high = np.where(outside, np.hypot(np.maximum(high, 0.0), max(self.bands_["seen"][1], 0.0)), high)
        return StepCorrection(factor, factor + np.minimum(low, 0.0), factor + np.maximum(high, 0.0))

    def software_offset(self, versions: Sequence[str | None]) -> np.ndarray:
        """Log factor of a step on each software version (PyTorch major.minor) against the newest the stage learned
        (what it answers): 0 for that one, any newer one and an unknown one (None, ""); a learned version's own
        offset; a version between two learned ones the newer one's (it runs at least as well as the version before
        it); one older than every learned version the oldest's (older software was not measured)."""
        software: dict[str, Any] = getattr(self, "software_", {})
        offsets: dict[str, float] = software.get("offsets", {})
        reference = str(software.get("reference", ""))
        known = sorted([*offsets, *([reference] if reference else [])], key=version_key)

        def offset(version: str | None) -> float:
            if not isinstance(version, str) or not version or not known:
                return 0.0
            later = [k for k in known if version_key(k) >= version_key(version)]  # its own first, if learned
            if not later:
                return 0.0  # newer than every learned version: answered as the newest
            return float(offsets.get(later[0], 0.0))

        return np.array([offset(v) for v in versions])

    def _outside(self, x: np.ndarray) -> np.ndarray:
        """Rows whose device features (those the spec sheet gives; not the step's convolution mix) lie outside the
        measured GPUs' range."""
        low, high = np.asarray(self.params_["low"]), np.asarray(self.params_["high"])
        finite = np.isfinite(x)
        beyond = (x < low - RANGE_TOLERANCE) | (x > high + RANGE_TOLERANCE)
        device = np.array([name not in CONV_MATH_FEATURES for name in self.feature_names], dtype=bool)
        return np.any((finite & beyond)[:, device], axis=1)

    def levels(self) -> dict[str, float]:
        """{job level key: its level as a factor} (how much slower than composed each measured model runs)."""
        self._check_fitted()
        return {k: float(np.exp(v)) for k, v in self.params_["levels"].items()}

    # --- persistence ----------------------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        self._check_fitted()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "stage.json").write_text(json.dumps({"params": self.params_, "extra": self.extra_weights_,
                                                          "bands": self.bands_, "software": self.software_},
                                                         indent=1, sort_keys=True) + "\n")
        Manifest(regressor=self.name, feature_names=self.feature_names, settings=self.get_params(),
                 normalisation={"target": "log(measured step ms / composed step ms), natural log",
                                "features": "clipped to the training range, centred on its mean"},
                 artifacts=("stage.json",), training_data_hash=self.training_hash_,
                 training_samples=self.n_samples_, metrics=self.metrics_).write(directory)
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> DeviceStepRegressor:
        directory = Path(directory)
        manifest = Manifest.read_for(directory, cls.name)
        settings = dict(manifest.settings)
        unseen = settings.get("unseen_features")
        model = cls(feature_names=manifest.feature_names, ridge=float(settings.get("ridge", 3.0)),
                    quantiles=tuple(settings.get("quantiles", (0.1, 0.9))),
                    unseen_features=None if unseen is None else tuple(unseen),
                    seen_only=tuple(settings.get("seen_only", ())))  # none in a stage saved before it was kept
        data = json.loads((directory / "stage.json").read_text())
        # a stage saved before unseen models had extra features answers them with its device effect alone
        model.params_, model.extra_weights_ = data["params"], data.get("extra", {})
        model.bands_ = data["bands"]
        model.software_ = data.get("software", {"reference": "", "offsets": {}})  # none before it was learned
        model.metrics_ = dict(manifest.metrics)
        model.training_hash_ = manifest.training_data_hash or ""
        model.n_samples_ = manifest.training_samples or 0
        return model

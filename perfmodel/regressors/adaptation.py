"""Few-shot adaptation of the per-op device model to one device, from that device's own measurements.

The shipped `xgb-device-ops` model predicts any catalog device from its spec sheet. A device with rows of its own
(`perfmodel hw bench`, or imported) gets a correction per op class: a Gaussian process on the log residuals
r = log(measured) - log(base prediction) of its rows,

    r ~ GP(0, c² + l² x·x' + s² exp(-|x - x'|² / 2ℓ²)) + N(0, σ²)

over a few standardised features of the row (`ADAPT_FEATURES`: the base prediction itself and the op's shape and
work), one GP per op class, and one per part of a step where the rows time a part as itself (`PART_GROUPS`: a
depthwise convolution's input and weight gradients). The prior mean is 0, so with few rows the correction shrinks
toward the base model (no rows: exactly the base model); the constant term c² learns a device-wide scale, the
linear term a trend with size, the RBF term regimes (small launch-bound ops vs large ones). The hyperparameters
(c, l, s, ℓ, σ) are picked from a small grid by marginal likelihood on the device's rows (coordinate-wise over
`GRIDS`). Residuals are winsorised per class first (a measurement stalled by another process must not drag the
fit), and a class's correction is used only if its closed-form leave-one-out MAPE on the rows beats the base
model's (`ClassAdaptation.active`).

Prediction: log median = base + posterior mean; the 80 % interval is the posterior predictive ± 1.28 sd, each
half never wider than the base model's (so an interval never grows with rows, and shrinks as rows pin the residual
down); the median is never below the roofline of the row's math on the device (as the base model's).

Saved per device (`save` / `load`): `adaptation.json` (per class: features, standardisation, hyperparameters, the
standardised rows and their residuals) and the rows themselves (`rows.json`: shapes and measured latency, so the
adaptation is refitted when the base model changes: `base_model_hash` differs), plus a `manifest.json` (feature
names, rows, data hash). JSON only, no pickle. Default home: `$PERFMODEL_HOME/adaptations/<device>/`.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.core.accuracy import Z80
from perfmodel.core.errors import PerfmodelError
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.regressors.manifest import Manifest, data_hash

NAME = "device-adaptation"
ADAPTATION_FILE = "adaptation.json"
ROWS_FILE = "rows.json"
MAX_ROWS_PER_CLASS = 800  # the GP's rows per class (a random subset beyond): its cost grows as rows³
MIN_FEATURE_SCALE = 1.0  # standardise by max(std, this) (log2 units), so a narrow sample does not blow up distances
OUTLIER_MADS = 4.0  # residuals are clipped to median ± this many robust sds before the fit
MIN_OUTLIER_SD = 0.25

GEMM_FEATURES = ("log_predicted_ms", "log_flops", "log_intensity", "log_m", "log_n", "log_k")
ADAPT_FEATURES: dict[str, tuple[str, ...]] = {
    "bmm": (*GEMM_FEATURES, "log_batch"),
    "linear": (*GEMM_FEATURES, "log_batch"),
    "conv2d": (*GEMM_FEATURES, "log_batch", "log_hidden"),  # log_m/n/k/hidden: channels in/out, size, kernel
    # max_pool (1 for a max pool's rows) and transcendental (1 for GELU, SiLU, tanh, sigmoid): on a CPU an NCHW max
    # pool takes 20-60x the time per byte of the additions and ReLUs over the same tensors, a transcendental op 4-14x,
    # which share their bytes and shape
    "elementwise": ("log_predicted_ms", "log_bytes", "log_batch", "log_hidden", "max_pool", "transcendental"),
    "softmax": ("log_predicted_ms", "log_bytes", "log_batch", "log_hidden"),
    "layernorm": ("log_predicted_ms", "log_bytes", "log_batch", "log_hidden"),
}
# hyperparameter grids (log-space sds): constant, linear, RBF amplitude, RBF length (standardised units), noise. A
# GPU's residuals are ~0.1-0.5 (the model's spread across GPUs); a CPU's are e^3 on average with sd 2-3 (the model
# never saw a CPU), hence the wide ranges. Searched coordinate-wise from `START` (`COORDINATE_SWEEPS` passes).
GRIDS: dict[str, tuple[float, ...]] = {
    "constant": (0.1, 0.3, 1.0, 3.0, 6.0),
    "linear": (0.0, 0.1, 0.3, 1.0),
    "rbf": (0.0, 0.15, 0.3, 0.6, 1.5, 3.0),
    "length": (0.5, 1.0, 2.0, 4.0),
    "noise": (0.03, 0.08, 0.2, 0.5, 1.0),
}
START = {"constant": 0.3, "linear": 0.1, "rbf": 0.3, "length": 1.0, "noise": 0.2}
COORDINATE_SWEEPS = 3
ROW_COLUMNS = ("op_class", "op_name", "dtype", "batch", "m", "n", "k", "hidden", "in_channels", "out_channels",
               "input_size", "kernel_size", "stride", "padding", "latency_ms", "part")
# Rows corrected apart from the rest of their op class: a depthwise convolution's gradient kernels, by part. The
# per-op model prices a backward row as the kernel of its shape (a row's features carry no part), right for GEMMs and
# dense convolutions, whose gradients are GEMMs of the same work, but not for a depthwise convolution on a CPU: there
# oneDNN's weight gradient and strided input gradient take 2-45x the forward (a 5 x 5 weight gradient over
# 4 x 240 x 28 x 28 took 46 ms against a 1 ms forward on a 2-core EPYC), and one GP over forward and gradient rows of
# the same features fits their geometric mean, far below their sum. The op sweep times each part of a real op as
# itself (`perfmodel.profilers.lowered_ops`; the part is in the row's `extra`); rows without a part (every imported
# row, a dense sweep's) and a device whose rows hold none of a group keep their class's GP.
# a depthwise row's part (`perfmodel.lowering.ops.OWN_KERNEL_PARTS`) -> its group
PART_GROUPS: dict[str, str] = {"dX": "conv2d:depthwise:dX", "dW": "conv2d:depthwise:dW"}
GROUP_CLASS: dict[str, str] = {group: "conv2d" for group in PART_GROUPS.values()}
MIN_GROUP_ROWS = 8  # fewer rows of a part group: they stay in their class's GP


@contextmanager
def _one_thread() -> Iterator[None]:
    """Run the GP's small dense algebra on one torch thread: on a loaded 2-core machine a multi-threaded BLAS
    spins (a 200 x 200 Cholesky took 0.3 s with two OpenBLAS threads, 3 ms with one)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _kernel(a: Any, b: Any, hyper: Mapping[str, float]) -> Any:
    """The covariance between the rows of `a` and `b` (torch float64 tensors)."""
    import torch

    sq = torch.cdist(a, b) ** 2
    return (hyper["constant"] ** 2 + hyper["linear"] ** 2 * (a @ b.T)
            + hyper["rbf"] ** 2 * torch.exp(-sq / (2 * hyper["length"] ** 2)))


def _log_marginal(k: Any, r: Any, noise: float) -> float:
    import torch

    chol, info = torch.linalg.cholesky_ex(k + noise**2 * torch.eye(len(r), dtype=k.dtype))
    if int(info) != 0:
        return -np.inf
    alpha = torch.cholesky_solve(r[:, None], chol)[:, 0]
    return float(-0.5 * (r @ alpha) - torch.log(torch.diagonal(chol)).sum())


def class_of(group: str) -> str:
    """The op class of an adaptation group (`PART_GROUPS`): a group's rows are rows of that class."""
    return GROUP_CLASS.get(group, group)


def row_parts(rows: pd.DataFrame) -> pd.Series:
    """Each row's part of the step (fwd, dX, dW, grad) where it is known: the `part` column, else the part a real
    op's row keeps in its `extra` (`perfmodel.profilers.bench_rows.real_op_extra`); None elsewhere."""
    if "part" in rows:
        return rows["part"].where(rows["part"].notna(), None)
    extra = rows["extra"] if "extra" in rows else pd.Series(None, index=rows.index, dtype=object)
    return pd.Series([e.get("part") if isinstance(e, dict) else None for e in extra], index=rows.index, dtype=object)


def adaptation_groups(rows: pd.DataFrame, fitted: Collection[str] | None = None) -> np.ndarray:
    """The GP that corrects each row: its op class, or its part's group (`PART_GROUPS`) for a depthwise
    convolution's gradient row, where `fitted` (the groups an adaptation has; None: every group) holds that group."""
    from perfmodel.lowering.ops import own_kernel_parts

    groups = rows["op_class"].to_numpy(dtype=object).copy()
    if not len(rows):
        return groups
    own = own_kernel_parts(rows.assign(part=row_parts(rows)))
    for part, group in PART_GROUPS.items():
        if fitted is None or group in fitted:
            groups[own == part] = group
    return groups


@dataclass(frozen=True)
class ClassAdaptation:
    """The GP of one op class: standardised training inputs, their residuals and the chosen hyperparameters."""

    op_class: str
    features: tuple[str, ...]
    center: tuple[float, ...]
    scale: tuple[float, ...]
    hyper: dict[str, float]
    x: np.ndarray  # rows × features, standardised
    residual: np.ndarray  # log(measured / base prediction)

    @classmethod
    def fit(cls, op_class: str, features: pd.DataFrame, residual: np.ndarray) -> ClassAdaptation:
        """The GP of the rows of `op_class`, an op class or a part group (`PART_GROUPS`)."""
        names = ADAPT_FEATURES[class_of(op_class)]
        raw = features[list(names)].to_numpy(dtype=np.float64)
        center = raw.mean(axis=0)
        scale = np.maximum(raw.std(axis=0), MIN_FEATURE_SCALE)
        x = (raw - center) / scale
        import torch

        with _one_thread():
            xt, rt = torch.from_numpy(x), torch.from_numpy(np.asarray(residual, dtype=np.float64))
            sq, dot = torch.cdist(xt, xt) ** 2, xt @ xt.T
            scores: dict[tuple[float, ...], float] = {}

            def score(hyper: dict[str, float]) -> float:
                key = tuple(hyper[name] for name in GRIDS)
                if key not in scores:
                    k = (hyper["constant"] ** 2 + hyper["linear"] ** 2 * dot
                         + hyper["rbf"] ** 2 * torch.exp(-sq / (2 * hyper["length"] ** 2)))
                    scores[key] = _log_marginal(k, rt, hyper["noise"])
                return scores[key]

            best = dict(START)
            best_score = score(best)
            for _ in range(COORDINATE_SWEEPS):
                moved = False
                for name, values in GRIDS.items():
                    for value in values:
                        candidate = {**best, name: value}
                        if score(candidate) > best_score + 1e-9:
                            best, best_score, moved = candidate, score(candidate), True
                if not moved:
                    break
        if not np.isfinite(best_score):
            raise PerfmodelError(f"adaptation of {op_class}: no hyperparameters fit its {len(residual)} rows")
        with _one_thread():  # closed-form leave-one-out residuals of the chosen GP: r_i - mean_-i = alpha_i / K^-1_ii
            k = (best["constant"] ** 2 + best["linear"] ** 2 * dot
                 + best["rbf"] ** 2 * torch.exp(-sq / (2 * best["length"] ** 2)))
            chol = torch.linalg.cholesky(k + best["noise"] ** 2 * torch.eye(len(rt), dtype=k.dtype))
            inverse = torch.cholesky_inverse(chol)
            loo = (inverse @ rt) / torch.diagonal(inverse)
        # APE of a prediction off by a log residual e: |exp(-e) - 1| (left out: e = loo; the base model: e = r)
        loo_mape = float(np.mean(np.abs(np.expm1(-loo.numpy()))) * 100)
        base_mape = float(np.mean(np.abs(np.expm1(-np.asarray(residual)))) * 100)
        gate = {"loo_mape_pct": loo_mape, "base_mape_pct": base_mape, "active": float(loo_mape < base_mape)}
        return cls(op_class, names, tuple(center), tuple(scale), {**best, **gate}, x,
                   np.asarray(residual, dtype=np.float64))

    @property
    def active(self) -> bool:
        """Whether the correction beat the base model's MAPE on its own rows left out one at a time (else the base
        model's prediction and interval stand: never worse than no rows, as far as the rows can tell)."""
        return bool(self.hyper.get("active", 1.0))

    @cached_property
    def _solved(self) -> tuple[Any, Any, Any]:
        """The rows (torch), the Cholesky factor of their covariance (with noise) and K⁻¹ r, computed once."""
        import torch

        with _one_thread():
            x = torch.from_numpy(self.x)
            k = _kernel(x, x, self.hyper) + self.hyper["noise"] ** 2 * torch.eye(len(x), dtype=x.dtype)
            chol = torch.linalg.cholesky(k)
            alpha = torch.cholesky_solve(torch.from_numpy(self.residual)[:, None], chol)[:, 0]
        return x, chol, alpha

    def posterior(self, features: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean of the log residual at each row, and the predictive sd (with noise)."""
        import torch

        z = (features[list(self.features)].to_numpy(dtype=np.float64) - np.asarray(self.center)) / np.asarray(
            self.scale)
        x, chol, alpha = self._solved
        with _one_thread():
            zt = torch.from_numpy(np.ascontiguousarray(z))
            cross = _kernel(zt, x, self.hyper)
            mean = cross @ alpha
            v = torch.linalg.solve_triangular(chol, cross.T, upper=False)
            prior = (self.hyper["constant"] ** 2 + self.hyper["linear"] ** 2 * (zt * zt).sum(1)
                     + self.hyper["rbf"] ** 2)
            var = torch.clamp(prior - (v * v).sum(0), min=0.0) + self.hyper["noise"] ** 2
        return mean.numpy(), torch.sqrt(var).numpy()

    def to_json(self) -> dict[str, Any]:
        return {"features": list(self.features), "center": list(self.center), "scale": list(self.scale),
                "hyper": self.hyper, "x": self.x.round(6).tolist(), "residual": self.residual.round(6).tolist()}

    @classmethod
    def from_json(cls, op_class: str, data: Mapping[str, Any]) -> ClassAdaptation:
        return cls(op_class, tuple(data["features"]), tuple(data["center"]), tuple(data["scale"]),
                   dict(data["hyper"]), np.asarray(data["x"], dtype=np.float64).reshape(-1, len(data["features"])),
                   np.asarray(data["residual"], dtype=np.float64))


def adapt_features(model: Any, ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec], base: Any = None
                   ) -> tuple[pd.DataFrame, Any]:
    """The device-op features of `ops` plus `log_predicted_ms` (log2 of the base model's median), and the base
    model's prediction."""
    from perfmodel.features.device_ops import device_op_features
    from perfmodel.lowering.ops import MAX_POOL_ROWS, TRANSCENDENTAL_ROWS

    base = base if base is not None else model.predict(ops, catalog)
    names = ops["op_name"] if "op_name" in ops else pd.Series("", index=ops.index)
    features = device_op_features(ops, catalog).assign(
        log_predicted_ms=np.log2(base.latency_ms), max_pool=names.isin(MAX_POOL_ROWS).to_numpy(dtype=float),
        transcendental=names.isin(TRANSCENDENTAL_ROWS).to_numpy(dtype=float))
    return features, base


def _winsorised(residual: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Residuals clipped, per op class (or group), to median ± `OUTLIER_MADS` robust sds (1.4826 MAD, at least
    `MIN_OUTLIER_SD`): a measurement stalled by another process must not drag the Gaussian fit."""
    out = residual.copy()
    for op_class in set(classes):
        mask = classes == op_class
        values = residual[mask]
        center = np.median(values)
        spread = max(1.4826 * np.median(np.abs(values - center)), MIN_OUTLIER_SD)
        out[mask] = np.clip(values, center - OUTLIER_MADS * spread, center + OUTLIER_MADS * spread)
    return out


@dataclass(frozen=True)
class DeviceAdaptation:
    """Corrections of a base device-ops model on one device, one GP per op class that has rows (and per part group
    with rows: `PART_GROUPS`), by group name in `classes`."""

    device: str
    base_model_hash: str | None
    classes: dict[str, ClassAdaptation]
    rows: pd.DataFrame  # the measured rows it was fitted on (`ROW_COLUMNS`)

    @property
    def rows_per_class(self) -> dict[str, int]:
        return {c: int(len(a.residual)) for c, a in sorted(self.classes.items())}

    @classmethod
    def fit(cls, model: Any, rows: pd.DataFrame, catalog: Mapping[str, HardwareSpec], device: str | None = None,
            seed: int = 0) -> DeviceAdaptation:
        """Fit on `rows` (measured ops of one device: `op_class`, shapes, `dtype`, `latency_ms`; `device` set or
        given) the residuals of `model` (a fitted `DeviceOpRegressor`)."""
        if rows.empty:
            raise PerfmodelError("no rows to adapt on")
        device = device or str(rows["device"].iloc[0])
        rows = rows.assign(device=device)
        if (set(rows["device"]) - {device}):
            raise PerfmodelError(f"adaptation rows must all be of device {device!r}")
        rows = rows[rows["op_class"].isin(set(model.boosters_) & set(ADAPT_FEATURES))]
        latency = pd.to_numeric(rows["latency_ms"], errors="coerce")
        if rows.empty or not (latency > 0).all():
            raise PerfmodelError("adaptation rows need an op class the model knows and a positive latency_ms")
        rows = rows.assign(part=row_parts(rows))
        groups = adaptation_groups(rows)
        for group in PART_GROUPS.values():  # too few rows of a part: they stay in their class's process
            few = groups == group
            if few.sum() < MIN_GROUP_ROWS:
                groups[few] = class_of(group)
        rng = np.random.default_rng(seed)
        kept = []
        for group in sorted(set(groups)):
            index = np.flatnonzero(groups == group)
            if len(index) > MAX_ROWS_PER_CLASS:
                index = np.sort(rng.choice(index, MAX_ROWS_PER_CLASS, replace=False))
            kept.append(index)
        order = np.concatenate(kept)
        rows, groups = rows.iloc[order].reset_index(drop=True), groups[order]
        features, base = adapt_features(model, rows, catalog)
        residual = np.log(rows["latency_ms"].to_numpy(dtype=np.float64)) - np.log(base.latency_ms)
        residual = _winsorised(residual, groups)
        classes = {}
        for group in sorted(set(groups)):
            mask = groups == group
            classes[group] = ClassAdaptation.fit(group, features[mask], residual[mask])
        kept_columns = [c for c in ROW_COLUMNS if c in rows]
        return cls(device, getattr(model, "training_hash_", None), classes, rows[kept_columns].copy())

    def apply(self, ops: pd.DataFrame, base: Any, features: pd.DataFrame) -> Any:
        """`base` (an `OpPrediction` of `ops`, all on this device) corrected where this adaptation has the class."""
        median, low, high = np.log(base.latency_ms), np.log(base.p10_ms), np.log(base.p90_ms)
        median, low, high = median.copy(), low.copy(), high.copy()
        roofline = np.log(np.exp2(features["log_roofline_ms"].to_numpy()))
        groups = adaptation_groups(ops, fitted=self.classes)
        for op_class, adaptation in self.classes.items():
            mask = groups == op_class
            if not mask.any():
                continue
            if not adaptation.active:
                continue
            mean, sd = adaptation.posterior(features[mask])
            m = np.maximum(median[mask] + mean, roofline[mask])
            half_low = np.minimum(Z80 * sd, median[mask] - low[mask])
            half_high = np.minimum(Z80 * sd, high[mask] - median[mask])
            median[mask], low[mask], high[mask] = m, m - half_low, m + half_high
        return type(base)(np.exp(median), np.exp(low), np.exp(high), base.extrapolated)

    def measured_kernels(self, ops: pd.DataFrame) -> np.ndarray:
        """Which of `ops` (rows of this device) this adaptation prices from rows of their own kernel: those of a part
        group (`PART_GROUPS`) it has fitted and applies."""
        active = [g for g in PART_GROUPS.values() if g in self.classes and self.classes[g].active]
        return np.isin(adaptation_groups(ops, fitted=active), active)

    def predict(self, model: Any, ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> Any:
        """`model`'s prediction of `ops` (rows of this device) with this adaptation applied."""
        ops = ops.assign(device=self.device)
        features, base = adapt_features(model, ops, catalog)
        return self.apply(ops, base, features)

    # --- artifacts ---

    def data_hash(self) -> str:
        return data_hash(json.dumps(r, sort_keys=True, default=str) for r in self.rows.to_dict("records"))

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        payload = {"device": self.device, "base_model_hash": self.base_model_hash,
                   "classes": {c: a.to_json() for c, a in self.classes.items()}}
        (directory / ADAPTATION_FILE).write_text(json.dumps(payload) + "\n")
        rows = self.rows.astype(object).where(self.rows.notna(), None)
        (directory / ROWS_FILE).write_text(json.dumps(rows.to_dict("list")) + "\n")
        names = sorted({f for a in self.classes.values() for f in a.features})
        manifest = Manifest(regressor=NAME, feature_names=tuple(names),
                            normalisation={"target": "log(latency_ms) - log(base model median)",
                                           "features": "per class: (x - center) / scale, in adaptation.json"},
                            settings={"device": self.device, "base_model_hash": self.base_model_hash},
                            artifacts=(ADAPTATION_FILE, ROWS_FILE), training_data_hash=self.data_hash(),
                            training_samples=int(len(self.rows)), metrics={"rows_per_class": self.rows_per_class})
        return manifest.write(directory)

    @classmethod
    def load(cls, directory: str | Path) -> DeviceAdaptation:
        directory = Path(directory)
        manifest = Manifest.read(directory)
        if manifest.regressor != NAME:
            raise PerfmodelError(f"{directory} holds a {manifest.regressor!r}, not a {NAME!r}")
        payload = json.loads((directory / ADAPTATION_FILE).read_text())
        rows = pd.DataFrame(json.loads((directory / ROWS_FILE).read_text()))
        classes = {c: ClassAdaptation.from_json(c, d) for c, d in payload["classes"].items()}
        unknown = sorted(c for c in classes if class_of(c) not in ADAPT_FEATURES)
        if unknown:
            raise PerfmodelError(f"{directory}: adaptation of op classes this perfmodel does not know: {unknown}")
        return cls(payload["device"], payload.get("base_model_hash"), classes, rows)

    def for_model(self, model: Any, catalog: Mapping[str, HardwareSpec]) -> DeviceAdaptation:
        """This adaptation for `model`: itself if fitted on that model's residuals, else refitted on its rows."""
        if self.base_model_hash == getattr(model, "training_hash_", None):
            return self
        return DeviceAdaptation.fit(model, self.rows.assign(device=self.device), catalog, device=self.device)


def adaptations_dir(home: Path | None = None) -> Path:
    from perfmodel.settings import get_settings

    return (home or get_settings().home) / "adaptations"


def load_adaptations(directory: Path | None = None, catalog: Mapping[str, HardwareSpec] | None = None
                     ) -> dict[str, DeviceAdaptation]:
    """Every saved adaptation under `directory` (default `adaptations_dir()`) of a device in `catalog` (if
    given), by device."""
    directory = directory or adaptations_dir()
    out: dict[str, DeviceAdaptation] = {}
    if not directory.is_dir():
        return out
    for sub in sorted(directory.iterdir()):
        if (sub / "manifest.json").exists():
            adaptation = DeviceAdaptation.load(sub)
            if catalog is None or adaptation.device in catalog:
                out[adaptation.device] = adaptation
    return out


class AdaptedRegressor:
    """A device-ops regressor whose predictions for the adapted devices use their adaptation; every other row is
    the base model's, unchanged. Same `predict(ops, catalog)` as the base."""

    def __init__(self, base: Any, adaptations: Mapping[str, DeviceAdaptation],
                 catalog: Mapping[str, HardwareSpec]):
        self.base = base
        self.adaptations = {d: a.for_model(base, catalog) for d, a in adaptations.items()}
        self.name = base.name
        self.boosters_ = base.boosters_
        self.domain_ = base.domain_
        self.training_hash_ = getattr(base, "training_hash_", None)

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(sorted(self.adaptations))

    def measured_kernels(self, ops: pd.DataFrame) -> np.ndarray:
        """Rows an adapted device prices from rows of their own kernel (`DeviceAdaptation.measured_kernels`)."""
        out = np.zeros(len(ops), dtype=bool)
        for device, adaptation in self.adaptations.items():
            mask = (ops["device"] == device).to_numpy() if len(ops) else out
            if mask.any():
                out[mask] = adaptation.measured_kernels(ops[mask])
        return out

    def predict(self, ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> Any:
        out = self.base.predict(ops, catalog)
        adapted = [d for d in self.adaptations if (ops["device"] == d).any()] if len(ops) else []
        if not adapted:
            return out
        median, low, high = out.latency_ms.copy(), out.p10_ms.copy(), out.p90_ms.copy()
        for device in adapted:
            mask = (ops["device"] == device).to_numpy()
            rows = ops[mask]
            part = type(out)(median[mask], low[mask], high[mask], out.extrapolated[mask])
            features, _ = adapt_features(self.base, rows, catalog, base=part)
            fixed = self.adaptations[device].apply(rows, part, features)
            median[mask], low[mask], high[mask] = fixed.latency_ms, fixed.p10_ms, fixed.p90_ms
        return type(out)(median, low, high, out.extrapolated)


def adapted(base: Any, catalog: Mapping[str, HardwareSpec], directory: Path | None = None) -> Any:
    """`base` wrapped with the saved adaptations of devices in `catalog` (or `base` itself when there are none)."""
    found = load_adaptations(directory, catalog)
    return AdaptedRegressor(base, found, catalog) if found else base


__all__ = ["ADAPT_FEATURES", "PART_GROUPS", "AdaptedRegressor", "ClassAdaptation", "DeviceAdaptation",
           "adaptation_groups", "adapted", "adaptations_dir", "load_adaptations", "row_parts"]

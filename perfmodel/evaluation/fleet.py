"""The fleet calibration judged on real runs: observe some jobs, predict others, on GPUs with several models.

Each measured configuration of the composed frame (`perfmodel.evaluation.real_runs.composed_frame`: one run of a
model at a per-GPU batch on n GPUs, measured and predicted through the serving path) becomes a `FleetPoint` of the
job "model in its precision" (the fleet's job effect is a model's, whatever its batch). Two protocols:

- `same_gpu`: on each GPU and math mode, observe k models (every choice of k, or `draws` random ones), predict the
  other models' runs on that GPU at 1 and n GPUs from those observations alone;
- `job_elsewhere`: a scheduler's fleet: every other model observed on every GPU, and the asked model on k other GPUs
  (random); predict the asked model's runs on a GPU it was not observed on.

Every prediction is of a run none of whose own measurements were used.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.calibration.fleet import FleetPoint, FleetPriors, FleetQuery, device_math, fit_fleet
from perfmodel.core.accuracy import Z80, throughput_ape
from perfmodel.hardware.chips import die_of
from perfmodel.hardware.spec import HardwareSpec


def fleet_frame(composed: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> pd.DataFrame:
    """The composed frame with what the fleet needs: job, chip, architecture, log ratio, communication share."""
    frame = composed.reset_index(drop=True)
    return frame.assign(
        job=frame.model + ":" + frame.precision,
        math=frame.precision.map(device_math),  # the math whose device effects the fleet shares (`device_math`)
        chip=frame.accelerator.map(die_of),
        architecture=frame.accelerator.map(lambda a: catalog[a].architecture or a),
        log_ratio=np.log(frame.measured_ms / frame.placement_ms),
        communication_share=(frame.communication_ms / frame.placement_ms).fillna(0.0).clip(0.0, 1.0))


def points_of(frame: pd.DataFrame) -> list[FleetPoint]:
    return [FleetPoint(int(i), r["job"], r["accelerator"], r["chip"], r["architecture"], r["precision"],
                       float(r["log_ratio"]), float(r["communication_share"]))
            for i, r in zip(frame.index, frame.to_dict("records"))]


def _query(r: dict[Any, Any]) -> FleetQuery:
    return FleetQuery(r["job"], r["accelerator"], r["chip"], r["architecture"], r["precision"],
                      float(r["communication_share"]))


def predict_rows(points: Iterable[FleetPoint], targets: pd.DataFrame,
                 priors: FleetPriors = FleetPriors()) -> pd.DataFrame:
    """`targets` with the fleet's calibrated prediction (`predicted_ms`), its 80 % interval and level. Where the
    targets carry the served answer's band (`served_low_ms`, `served_high_ms` about `placement_ms`), the interval is
    the one the service gives: that band, its log width scaled by the calibration's `interval_scale`; otherwise
    the fleet's own predictive spread."""
    fleet = fit_fleet(points, priors)
    predicted, low, high, level = [], [], [], []
    banded = {"served_low_ms", "served_high_ms"} <= set(targets.columns)
    for r in targets.to_dict("records"):
        query = _query(r)
        applied = fleet.apply(query)
        served_ms = float(r["placement_ms"])
        ms = served_ms / applied.throughput_factor
        predicted.append(ms)
        if banded:
            low.append(ms * (float(r["served_low_ms"]) / served_ms) ** applied.interval_scale)
            high.append(ms * (float(r["served_high_ms"]) / served_ms) ** applied.interval_scale)
        else:
            sigma = applied.log_sigma if applied.log_sigma is not None else math.sqrt(fleet.variances(query)[1])
            low.append(ms * math.exp(-Z80 * sigma))
            high.append(ms * math.exp(Z80 * sigma))
        level.append(applied.level)
    return targets.assign(predicted_ms=predicted, low_ms=low, high_ms=high, level=level)


def same_gpu(frame: pd.DataFrame, ks: Sequence[int] = (0, 1, 2, 4), draws: int = 20,
             seed: int = 0, priors: FleetPriors = FleetPriors()) -> pd.DataFrame:
    """Protocol `same_gpu`: one row per predicted run and draw, with `k` (`priors`: the fleet's)."""
    rng = random.Random(seed)
    out = []
    for _, gpu in frame.groupby(["accelerator", "math"]):
        models = sorted(gpu.model.unique())
        for k in ks:
            if len(models) < k + 1:
                continue
            choices = list(itertools.combinations(models, k))
            rng.shuffle(choices)
            for draw, observed in enumerate(choices[:draws]):
                seen = gpu.model.isin(observed)
                rows = predict_rows(points_of(gpu[seen]), gpu[~seen], priors)
                out.append(rows.assign(k=k, draw=draw))
    return pd.concat(out, ignore_index=True)


def shrunk_other_models(frame: pd.DataFrame, ks: Sequence[int] = (1, 2, 4), draws: int = 20, seed: int = 0,
                        shrinks: Sequence[float] = tuple(np.linspace(0.0, 1.0, 21))) -> pd.DataFrame:
    """What the best single shrinkage of other models' errors could do, one GPU (a ceiling, not a hold-out): on each
    GPU and math mode, k models observed as in `same_gpu` (the same draws), each other model's one-GPU runs corrected
    by `shrink` times the mean of the observed models' mean log error there; per k, the MAPE of every shrink and the
    best one, chosen on these same runs. A rule that knows only how far each observed model is off, and applies one
    share of it to the others, does no better than that best."""
    rng = random.Random(seed)
    one = frame[frame.devices == 1]
    shrink = np.asarray(shrinks, dtype=np.float64)
    errors: dict[int, list[np.ndarray]] = {k: [] for k in ks}
    for _, gpu in one.groupby(["accelerator", "math"]):
        models = sorted(gpu.model.unique())
        means = gpu.groupby("model").log_ratio.mean()
        for k in ks:
            if len(models) < k + 1:
                continue
            choices = list(itertools.combinations(models, k))
            rng.shuffle(choices)
            for observed in choices[:draws]:
                others = gpu[~gpu.model.isin(observed)].log_ratio.to_numpy()
                shift = float(means[list(observed)].mean())
                e = others[:, None] - shrink[None, :] * shift  # log(measured / corrected step)
                errors[k].append(throughput_ape(1.0, np.exp(e)) * 100)
    rows = []
    for k, parts in errors.items():
        if not parts:
            continue
        mape = np.concatenate(parts).mean(axis=0)
        best = int(np.argmin(mape))
        rows.append({"k": k, "best_shrink": float(shrink[best]), "best_mape_1gpu_pct": float(mape[best]),
                     "mape_at_0_pct": float(mape[0]), "mape_at_1_pct": float(mape[-1])})
    return pd.DataFrame(rows).set_index("k")


def job_elsewhere(frame: pd.DataFrame, ks: Sequence[int] = (0, 1, 2, 4), seed: int = 0,
                  every: int = 1, priors: FleetPriors = FleetPriors()) -> pd.DataFrame:
    """Protocol `job_elsewhere`: one row per predicted run, with `k` (GPUs the asked model was observed on).
    `every`: predict every n-th GPU of each model only (faster); `priors`: the fleet's."""
    rng = random.Random(seed)
    everything = points_of(frame)
    out = []
    for job, runs in frame.groupby("job"):
        others = [p for p in everything if p.job != job]
        gpus = sorted(runs.accelerator.unique())
        for accelerator in gpus[::every]:
            rest = [g for g in gpus if g != accelerator]
            rng.shuffle(rest)
            for k in ks:
                if len(rest) < k:
                    continue
                seen = runs[runs.accelerator.isin(rest[:k])]
                rows = predict_rows(others + points_of(seen), runs[runs.accelerator == accelerator], priors)
                out.append(rows.assign(k=k))
    return pd.concat(out, ignore_index=True)


def summary(rows: pd.DataFrame, by: Sequence[str] = ("k",)) -> pd.DataFrame:
    """MAPE at one GPU and at 2-16, the 80 % interval's coverage, and the count, per `by`."""
    err = throughput_ape(rows.predicted_ms, rows.measured_ms) * 100
    covered = (rows.low_ms <= rows.measured_ms) & (rows.measured_ms <= rows.high_ms)
    frame = rows.assign(ape=err, covered=covered, one=rows.devices == 1)
    grouped = frame.groupby(list(by))
    return pd.DataFrame({
        "mape_1gpu_pct": grouped.apply(lambda g: g.ape[g.one].mean(), include_groups=False),
        "mape_ngpu_pct": grouped.apply(lambda g: g.ape[~g.one].mean(), include_groups=False),
        "coverage_80_pct": grouped.covered.mean() * 100,
        "runs": grouped.size(),
    })


OP_GROUP_SHARES = ("share_matmul", "share_conv", "share_autocast_fp32", "share_vector", "share_optimizer",
                   "share_overhead")  # of the composed step; the rest is one more column


def error_floors(frame: pd.DataFrame, sweeps: int = 50) -> dict[str, float]:
    """How far per-device factors can take the one-GPU answers, whatever the fit (MAPE %, fitted in sample):
    - `gpu_and_model`: one factor per (GPU, math) and one per (model, math), fitted on every run: the floor of any
      calibration by a device factor and a model factor, the asked model's own included;
    - `op_groups_per_gpu`: per (GPU, math), one factor per op group of the composed step (its shares), fitted on every
      model there, the asked one included: the floor of op-group device factors;
    - `other_models_mean`: per (GPU, math), the asked model corrected by the mean log error of every other model
      observed there (no prior): what "the GPU's factor" says of a new model."""
    one = frame[frame.devices == 1].reset_index(drop=True)
    r = one.log_ratio.to_numpy()
    gpu, model = one.accelerator + ":" + one.math, one.job
    a = b = np.zeros(len(one))
    for _ in range(sweeps):  # alternating means: the least-squares two-way additive fit
        a = pd.Series(r - b).groupby(gpu).transform("mean").to_numpy()
        b = pd.Series(r - a).groupby(model).transform("mean").to_numpy()
    residual = {"gpu_and_model": r - a - b}
    shares = one[list(OP_GROUP_SHARES)].to_numpy()
    columns = np.c_[shares, 1.0 - shares.sum(axis=1)]
    op_groups, others = np.empty(len(one)), np.empty(len(one))
    jobs = one.job.to_numpy()
    for _, rows in one.groupby(gpu).groups.items():
        idx = np.asarray(rows)
        weights, *_ = np.linalg.lstsq(columns[idx], r[idx], rcond=None)
        op_groups[idx] = r[idx] - columns[idx] @ weights
        for i in idx:
            rest = idx[jobs[idx] != jobs[i]]
            others[i] = r[i] - r[rest].mean() if len(rest) else r[i]
    residual.update(op_groups_per_gpu=op_groups, other_models_mean=others)
    # e = log(measured / corrected step)
    return {name: float(np.mean(throughput_ape(1.0, np.exp(e))) * 100) for name, e in residual.items()}


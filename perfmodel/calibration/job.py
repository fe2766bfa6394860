"""Calibration by the throughput running jobs report back, built so that no report can poison it.

An observation is first checked against physics (`check_observation`): a job cannot run faster than the FLOPs of
one sample allow on the placement's devices at the fastest math its precision uses (`ceiling_samples_per_s`), and
a report more than `MIN_OBSERVED_OVER_PREDICTED`⁻¹ times below the model's own uncalibrated prediction is refused
as absurd (a unit slip: samples/min, per-device throughput of a 1,000-GPU job, ...). Both refusals are the
client's error, never stored.

What is stored then calibrates robustly (`calibrate`), per (job, accelerator):
- in log space: each point is log(observed / predicted) against the serving model;
- outliers are flagged and excluded: with 3 or more points, a point more than `OUTLIER_MADS` scaled median absolute
  deviations (at least `MIN_SPREAD_LOG` in log) from the median;
- the factor is the recency-weighted median of the kept log ratios (weight halves every `HALF_LIFE_DAYS`), so one
  point moves it at most to the middle and old points fade as the job's code or data change;
- per device count where it differs: a (accelerator, devices) group with `MIN_GROUP_POINTS` kept points whose own
  median is more than `GROUP_DIFFERS_LOG` from the accelerator's gets its own factor (communication the model
  mis-prices shows up there, not on one device).

How much it helps is measured leave-one-out (`Calibration.report`): each point is predicted from the job's other
points only, so the error after calibration is never flattered by the point itself.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from perfmodel.core import cost
from perfmodel.core.accuracy import mape_pct_or_none
from perfmodel.core.errors import PerfmodelError
from perfmodel.core.units import samples_per_s

HALF_LIFE_DAYS = 30.0
OUTLIER_MADS = 3.5
MAD_TO_SIGMA = 1.4826
MIN_SPREAD_LOG = 0.05  # ~5 %: points this close to the median are never outliers, however tight the rest
MIN_OUTLIER_POINTS = 3
MIN_GROUP_POINTS = 2
GROUP_DIFFERS_LOG = 0.1  # ~10 %
MIN_OBSERVED_OVER_PREDICTED = 0.01  # a report 100x below the model is refused as absurd
LEAVE_ONE_OUT_POINTS = 200  # the report's leave-one-out error is over the most recent points only


class ObservationRefused(PerfmodelError):
    """An observed throughput that cannot be true of the job on its placement; `field` names what is at fault."""

    field = "throughput_samples_per_s"


@dataclass(frozen=True)
class ObservedPoint:
    """One observation next to the serving model's uncalibrated prediction for its placement."""

    id: int
    accelerator: str
    devices: int
    observed_throughput_samples_per_s: float
    predicted_throughput_samples_per_s: float
    created_at: datetime | None = None

    @property
    def log_ratio(self) -> float:
        return math.log(self.observed_throughput_samples_per_s / self.predicted_throughput_samples_per_s)


@dataclass(frozen=True)
class Excluded:
    id: int
    reason: str


# --- physics -----------------------------------------------------------------------------------------------------

def flops_per_sample(spec: Any, graph: Any) -> float:
    """FLOPs one sample costs: forward (and backward when training) of the graph, over the batch it was built for."""
    totals = graph.totals
    flops = totals.flops_fwd + (totals.flops_bwd if spec.mode.value == "train" else 0)
    return float(flops / spec.batch_size)


def ceiling_samples_per_s(spec: Any, graph: Any, placement: Any, catalog: Mapping[str, Any]) -> float:
    """The most samples/s the placement could reach: every device at the peak of the fastest math the job's
    precision uses on it, doing nothing but the job's FLOPs. Infinite for a graph with no FLOPs."""
    from perfmodel.hardware.catalog import get_accelerator
    from perfmodel.hardware.math import peak_gflops
    from perfmodel.predictor.math_modes import maths_by_group

    hardware = get_accelerator(placement.accelerator, catalog)
    peak = max(peak_gflops(hardware, math_name, gemm=True)
               for math_name in set(maths_by_group(spec.precision, hardware).values()))
    per_sample = flops_per_sample(spec, graph)
    if per_sample <= 0:
        return math.inf
    return float(placement.devices * samples_per_s(1, float(cost.compute_ms(per_sample, peak))))


def check_observation(throughput_samples_per_s: float, *, ceiling_samples_per_s: float,
                      predicted_samples_per_s: float) -> None:
    """Refuse a throughput that is not a positive finite number, beats physics, or is absurdly below the model."""
    value = throughput_samples_per_s
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ObservationRefused(f"throughput_samples_per_s must be a positive finite number, got {value!r}")
    if value > ceiling_samples_per_s:
        raise ObservationRefused(
            f"throughput_samples_per_s {value:.4g} is above what this placement can physically reach "
            f"({ceiling_samples_per_s:.4g} samples/s: every device at its peak FLOP/s for the job's precision, doing "
            f"only the job's FLOPs); check the units (samples/s over the whole job) and the placement")
    floor = predicted_samples_per_s * MIN_OBSERVED_OVER_PREDICTED
    if value < floor:
        raise ObservationRefused(
            f"throughput_samples_per_s {value:.4g} is more than {1 / MIN_OBSERVED_OVER_PREDICTED:.0f}x below the "
            f"model's prediction ({predicted_samples_per_s:.4g} samples/s) for this placement: refused as a likely "
            f"unit or placement error (samples/s over the whole job, not per device, per minute or per token)")


# --- robust statistics ---------------------------------------------------------------------------------------------

def recency_weights(points: Sequence[ObservedPoint], now: datetime | None) -> list[float]:
    """Each point's weight: halved every `HALF_LIFE_DAYS` of its age (1 for all when `now` is None)."""
    if now is None:
        return [1.0] * len(points)
    out = []
    for point in points:
        if point.created_at is None:
            out.append(1.0)
            continue
        created = point.created_at if point.created_at.tzinfo else point.created_at.replace(tzinfo=timezone.utc)
        age_days = max((now - created).total_seconds() / 86400.0, 0.0)
        out.append(0.5 ** (age_days / HALF_LIFE_DAYS))
    return out


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The value where half the weight lies on each side (the mean of the two middles on an exact tie)."""
    if not values:
        raise ValueError("no values")
    pairs = sorted(zip(values, weights))
    total = sum(w for _, w in pairs)
    running = 0.0
    for i, (value, weight) in enumerate(pairs):
        running += weight
        if running > total / 2 * (1 + 1e-12):
            return value
        if abs(running - total / 2) <= total * 1e-12 and i + 1 < len(pairs):
            return (value + pairs[i + 1][0]) / 2
    return pairs[-1][0]


def outliers(points: Sequence[ObservedPoint], weights: Sequence[float]) -> list[Excluded]:
    """Points of one accelerator far from their (recency-weighted) median log ratio (none below
    `MIN_OUTLIER_POINTS`)."""
    if len(points) < MIN_OUTLIER_POINTS:
        return []
    logs = [p.log_ratio for p in points]
    median = weighted_median(logs, weights)
    mad = weighted_median([abs(x - median) for x in logs], weights)
    spread = max(MAD_TO_SIGMA * mad, MIN_SPREAD_LOG)
    return [Excluded(p.id, f"outlier: observed/predicted {math.exp(x):.3g} is {abs(x - median) / spread:.1f} "
                           f"robust deviations from this accelerator's median {math.exp(median):.3g}")
            for p, x in zip(points, logs) if abs(x - median) > OUTLIER_MADS * spread]


# --- calibration -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Calibration:
    """A job's calibration against the serving model: factors per accelerator (and per device count where it
    differs), and the points excluded with why."""

    points: tuple[ObservedPoint, ...] = ()
    by_accelerator: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    by_devices: Mapping[tuple[str, int], tuple[float, int]] = field(default_factory=dict)
    excluded: tuple[Excluded, ...] = ()
    now: datetime | None = None

    def factor(self, accelerator: str, devices: int) -> tuple[float, int]:
        """(factor, points behind it) for a prediction on `devices` of `accelerator`; (1, 0) with none."""
        group = self.by_devices.get((accelerator, devices))
        if group is not None:
            return group
        return self.by_accelerator.get(accelerator, (1.0, 0))

    def report(self) -> dict[str, Any]:
        """Counts, factors, excluded points with their reasons, and the leave-one-out error before and after."""
        recent = self.points[-LEAVE_ONE_OUT_POINTS:]
        kept = [p for p in recent if p.id not in {e.id for e in self.excluded}]
        observed = [p.observed_throughput_samples_per_s for p in kept]
        loo = leave_one_out(self.points, kept, now=self.now)
        return {
            "observations": len(self.points),
            "used": len(self.points) - len(self.excluded),
            "mape_uncalibrated_pct": mape_pct_or_none([p.predicted_throughput_samples_per_s for p in kept], observed),
            "mape_calibrated_pct": mape_pct_or_none(loo, observed),
            "by_accelerator": [{"accelerator": acc, "observations": n, "calibration_factor": f}
                               for acc, (f, n) in sorted(self.by_accelerator.items())],
            "by_device_count": [{"accelerator": acc, "devices": devices, "observations": n, "calibration_factor": f}
                                for (acc, devices), (f, n) in sorted(self.by_devices.items())],
            "excluded": [{"id": e.id, "reason": e.reason} for e in self.excluded],
        }


def calibrate(points: Iterable[ObservedPoint], *, now: datetime | None = None) -> Calibration:
    """The robust calibration of one job's points (see the module docstring)."""
    points = tuple(points)
    by_accelerator: dict[str, list[ObservedPoint]] = defaultdict(list)
    for point in points:
        by_accelerator[point.accelerator].append(point)
    excluded: list[Excluded] = []
    factors: dict[str, tuple[float, int]] = {}
    groups: dict[tuple[str, int], tuple[float, int]] = {}
    for accelerator, group in by_accelerator.items():
        dropped = outliers(group, recency_weights(group, now))
        excluded.extend(dropped)
        kept = [p for p in group if p.id not in {e.id for e in dropped}]
        pooled = weighted_median([p.log_ratio for p in kept], recency_weights(kept, now))
        factors[accelerator] = (math.exp(pooled), len(kept))
        by_count: dict[int, list[ObservedPoint]] = defaultdict(list)
        for point in kept:
            by_count[point.devices].append(point)
        for devices, same in by_count.items():
            if len(same) < MIN_GROUP_POINTS or len(by_count) == 1:
                continue
            own = weighted_median([p.log_ratio for p in same], recency_weights(same, now))
            if abs(own - pooled) > GROUP_DIFFERS_LOG:
                groups[(accelerator, devices)] = (math.exp(own), len(same))
    return Calibration(points=points, by_accelerator=factors, by_devices=groups, excluded=tuple(excluded), now=now)


def leave_one_out(points: Sequence[ObservedPoint], targets: Sequence[ObservedPoint], *,
                  now: datetime | None = None) -> list[float]:
    """Each target's calibrated prediction from the job's other points only (uncalibrated if there are none)."""
    out = []
    for target in targets:
        others = calibrate([p for p in points if p.id != target.id], now=now)
        scale, _ = others.factor(target.accelerator, target.devices)
        out.append(target.predicted_throughput_samples_per_s * scale)
    return out

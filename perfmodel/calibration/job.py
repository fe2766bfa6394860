"""Calibration by the throughput running jobs report back, built so that no report can poison it.

An observation is first checked against physics (`check_observation`): a job cannot run faster than the FLOPs of
one sample allow on the placement's devices at the fastest math its precision uses (`ceiling_samples_per_s`; on a
CPU, `CPU_PROBE_HEADROOM` times its probed GEMM rate), and
a report more than `MIN_OBSERVED_OVER_PREDICTED`⁻¹ times below the model's own uncalibrated prediction is refused
as absurd (a unit slip: samples/min, per-device throughput of a 1,000-GPU job, ...). Both refusals are the
client's error, never stored.

What is stored then calibrates robustly (`calibrate`), per (job, accelerator):
- in log space: each point is log(observed / predicted) against the serving model;
- outliers are flagged and excluded: with 3 or more points, a point more than `OUTLIER_MADS` scaled median absolute
  deviations (at least `MIN_SPREAD_LOG` in log) from the median;
- the factor is the recency-weighted median of the kept log ratios (weight halves every `HALF_LIFE_DAYS`;
  interpolated between the middle points, `weighted_median`), so a new point among equally recent ones moves it at
  most halfway, and old points fade as the job's code or data change;
- per device count where it differs: a (accelerator, devices) group with `MIN_GROUP_POINTS` kept points whose own
  median is more than `GROUP_DIFFERS_LOG` from the accelerator's gets its own factor (communication the model
  mis-prices shows up there, not on one device).

How much it helps is measured leave-one-out (`Calibration.report`): each point is predicted from the job's other
points only, so the error after calibration is never flattered by the point itself.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from typing import TYPE_CHECKING, Any

from perfmodel.core import cost
from perfmodel.core.accuracy import mape_pct_or_none
from perfmodel.core.errors import PerfmodelError
from perfmodel.core.units import samples_per_s

if TYPE_CHECKING:
    from perfmodel.core.ir import Graph
    from perfmodel.hardware.spec import HardwareSpec
    from perfmodel.jobs.spec import JobSpec
    from perfmodel.placement.spec import PlacementSpec

HALF_LIFE_DAYS = 30.0
OUTLIER_MADS = 3.5
MAD_TO_SIGMA = 1.4826
MIN_SPREAD_LOG = 0.05  # ~5 %: points this close to the median are never outliers, however tight the rest
MIN_OUTLIER_POINTS = 3
MIN_GROUP_POINTS = 1  # a device count the job reported is answered by its own reports there
GROUP_DIFFERS_LOG = 0.1  # ~10 %
MIN_OBSERVED_OVER_PREDICTED = 0.01  # a report 100x below the model is refused as absurd
# steps/s posted as samples/s: refused when the report times the per-device batch lands this close (a factor, either
# way) to the model's samples/s, and the report itself is further below the model than the batch over this factor
STEPS_SLIP_FACTOR = 2.0
STEPS_SLIP_MIN_BATCH = 16  # smaller batches leave the two readings too close to tell apart
# A CPU entry's fp32 figure is what `perfmodel hw probe` measured on one host (a GEMM rate, not a spec-sheet peak),
# and `cpu` answers for whatever host perfmodel runs on: its ceiling allows this much more. 4x covers the probe's
# distance to its own host's peak (~2x on the 2-core EPYC of the shipped entry) and a host of the same core count
# with twice the vector width (AVX-512, two FMA units).
CPU_PROBE_HEADROOM = 4.0
LEAVE_ONE_OUT_POINTS = 200  # the report's leave-one-out error is over the most recent points only
# what one more run of the job may differ by (log), before its own points show their spread: the fleet's prior
# noise (`FleetPriors.noise`, the part of the public runs' error no effect explains)
RUN_NOISE_LOG = 0.17


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
    # the share of the predicted step the device is busy (forward, backward, optimizer, communication)
    device_share: float = 1.0

    @property
    def log_ratio(self) -> float:
        return math.log(self.observed_throughput_samples_per_s / self.predicted_throughput_samples_per_s)

    @property
    def over_device_time(self) -> float:
        """The observed step over the predicted device time (the model's step is its device time over
        `device_share`)."""
        return self.predicted_throughput_samples_per_s / self.observed_throughput_samples_per_s / self.device_share


@dataclass(frozen=True)
class Excluded:
    id: int
    reason: str


# --- physics -----------------------------------------------------------------------------------------------------

def flops_per_sample(spec: JobSpec, graph: Graph) -> float:
    """FLOPs one sample costs: forward (and backward when training) of the graph, over the batch it was built for."""
    totals = graph.totals
    flops = totals.flops_fwd + (totals.flops_bwd if spec.mode.value == "train" else 0)
    return float(flops / spec.batch_size)


def ceiling_samples_per_s(spec: JobSpec, graph: Graph, placement: PlacementSpec,
                          catalog: Mapping[str, HardwareSpec]) -> float:
    """The most samples/s the placement could reach: every device at the peak of the fastest math the job's
    precision uses on it, doing nothing but the job's FLOPs. Infinite for a graph with no FLOPs."""
    from perfmodel.hardware.catalog import get_accelerator
    from perfmodel.hardware.math import peak_gflops
    from perfmodel.predictor.math_modes import maths_by_group

    hardware = get_accelerator(placement.accelerator, catalog)
    peak = max(peak_gflops(hardware, math_name, gemm=True)
               for math_name in set(maths_by_group(spec.precision, hardware).values()))
    if hardware.kind == "cpu":
        peak *= CPU_PROBE_HEADROOM
    per_sample = flops_per_sample(spec, graph)
    if per_sample <= 0:
        return math.inf
    return float(placement.devices * samples_per_s(1, float(cost.compute_ms(per_sample, peak))))


def check_observation(throughput_samples_per_s: float, *, ceiling_samples_per_s: float,
                      predicted_samples_per_s: float, samples_per_step: float | None = None) -> None:
    """Refuse a throughput that is not a positive finite number, beats physics, is absurdly below the model, or reads
    as steps/s: with `samples_per_step` (the per-device batch) of at least `STEPS_SLIP_MIN_BATCH`, a report that
    times it lands within `STEPS_SLIP_FACTOR` of the model's samples/s while the report is more than
    batch / `STEPS_SLIP_FACTOR` below the model (Gavel's tables are in steps/s: per worker, summed)."""
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
    if samples_per_step is not None and samples_per_step >= STEPS_SLIP_MIN_BATCH:
        as_samples = value * samples_per_step
        if as_samples / STEPS_SLIP_FACTOR < predicted_samples_per_s < as_samples * STEPS_SLIP_FACTOR:
            raise ObservationRefused(
                f"throughput_samples_per_s {value:.4g} reads as steps/s: times the per-device batch "
                f"({samples_per_step:g}) it is {as_samples:.4g} samples/s, near the model's "
                f"{predicted_samples_per_s:.4g}, while as samples/s it would be {predicted_samples_per_s / value:.0f}x "
                f"below it. Post samples/s over the whole job (steps/s x per-device batch, summed over the workers)")


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
    """The value where half the weight lies on each side, interpolated: each value sits at the middle of its weight
    on the cumulative scale (0-1), and the median is read at 0.5 between the two values around it. Of two points
    with nearly equal weights (two reports minutes apart), it is their mean, not whichever is a hair heavier; a
    value with most of the weight pulls it most of the way."""
    if not values:
        raise ValueError("no values")
    pairs = sorted(zip(values, weights))
    total = sum(w for _, w in pairs)
    if total <= 0:
        raise ValueError("weights must sum to more than 0")
    below, previous = 0.0, None
    for value, weight in pairs:
        position = (below + weight / 2) / total
        if position >= 0.5:
            if previous is None or position == previous[1]:
                return value
            share = (0.5 - previous[1]) / (position - previous[1])
            return previous[0] + share * (value - previous[0])
        previous, below = (value, position), below + weight
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
    # per accelerator: the log spread of its kept points (`RUN_NOISE_LOG` with one) and the device counts they ran
    spread: Mapping[str, float] = field(default_factory=dict)
    device_counts: Mapping[str, frozenset[int]] = field(default_factory=dict)

    def log_sigma(self, accelerator: str) -> float | None:
        """The predictive standard deviation (log) of the job's next run on `accelerator`, as its own points there
        say: their spread, and the uncertainty of their median (spread / sqrt(n)). None with no points."""
        _, count = self.by_accelerator.get(accelerator, (1.0, 0))
        if not count:
            return None
        return self.spread[accelerator] * math.sqrt(1.0 + 1.0 / count)

    def factor(self, accelerator: str, devices: int) -> tuple[float, int]:
        """(factor, points behind it) for a prediction on `devices` of `accelerator`; (1, 0) with none."""
        group = self.by_devices.get((accelerator, devices))
        if group is not None:
            return group
        return self.by_accelerator.get(accelerator, (1.0, 0))

    @cached_property
    def slowest_over_device_time(self) -> tuple[str, float] | None:
        """(accelerator, ratio): where the job's kept points put its step furthest above the predicted device time
        (`ObservedPoint.over_device_time`, the median of that accelerator's points); None with no points. Computed
        once per calibration (every answer of the job reads it)."""
        dropped = {e.id for e in self.excluded}
        ratios: dict[str, list[float]] = {}
        for point in self.points:
            if point.id not in dropped:
                ratios.setdefault(point.accelerator, []).append(point.over_device_time)
        if not ratios:
            return None
        return max(((accelerator, statistics.median(values)) for accelerator, values in sorted(ratios.items())),
                   key=lambda item: item[1])

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
    spread: dict[str, float] = {}
    device_counts: dict[str, frozenset[int]] = {}
    for accelerator, group in by_accelerator.items():
        dropped = outliers(group, recency_weights(group, now))
        excluded.extend(dropped)
        kept = [p for p in group if p.id not in {e.id for e in dropped}]
        weights = recency_weights(kept, now)
        pooled = weighted_median([p.log_ratio for p in kept], weights)
        factors[accelerator] = (math.exp(pooled), len(kept))
        spread[accelerator] = RUN_NOISE_LOG if len(kept) < 2 else max(
            MAD_TO_SIGMA * weighted_median([abs(p.log_ratio - pooled) for p in kept], weights), MIN_SPREAD_LOG)
        device_counts[accelerator] = frozenset(p.devices for p in kept)
        by_count: dict[int, list[ObservedPoint]] = defaultdict(list)
        for point in kept:
            by_count[point.devices].append(point)
        for devices, same in by_count.items():
            if len(same) < MIN_GROUP_POINTS or len(by_count) == 1:
                continue
            own = weighted_median([p.log_ratio for p in same], recency_weights(same, now))
            if abs(own - pooled) > GROUP_DIFFERS_LOG:
                groups[(accelerator, devices)] = (math.exp(own), len(same))
    return Calibration(points=points, by_accelerator=factors, by_devices=groups, excluded=tuple(excluded), now=now,
                       spread=spread, device_counts=device_counts)


def leave_one_out(points: Sequence[ObservedPoint], targets: Sequence[ObservedPoint], *,
                  now: datetime | None = None) -> list[float]:
    """Each target's calibrated prediction from the job's other points only (uncalibrated if there are none)."""
    out = []
    for target in targets:
        others = calibrate([p for p in points if p.id != target.id], now=now)
        scale, _ = others.factor(target.accelerator, target.devices)
        out.append(target.predicted_throughput_samples_per_s * scale)
    return out

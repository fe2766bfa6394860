"""Calibration by observed throughput: per (job, accelerator), the factor is the geometric mean of observed /
predicted throughput over that job's observations there, and later predictions are scaled by it.

How much it helps is measured leave-one-out: each observation is predicted with the factor of the job's *other*
observations on its accelerator (1 when it is the only one), so the error after calibration is never flattered by
the observation itself.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ObservedPoint:
    """One observation next to the current model's uncalibrated prediction for its placement."""

    id: int
    accelerator: str
    observed_throughput_samples_per_s: float
    predicted_throughput_samples_per_s: float

    @property
    def log_ratio(self) -> float:
        return math.log(self.observed_throughput_samples_per_s / self.predicted_throughput_samples_per_s)


def factor(log_ratios: Sequence[float]) -> float:
    """The geometric mean of the ratios whose logs are given; 1 for none."""
    return math.exp(sum(log_ratios) / len(log_ratios)) if log_ratios else 1.0


def factors(points: Sequence[ObservedPoint]) -> dict[str, tuple[float, int]]:
    """accelerator -> (calibration factor, observations behind it)."""
    by_accelerator: dict[str, list[float]] = defaultdict(list)
    for point in points:
        by_accelerator[point.accelerator].append(point.log_ratio)
    return {acc: (factor(logs), len(logs)) for acc, logs in by_accelerator.items()}


def leave_one_out(points: Sequence[ObservedPoint]) -> list[float]:
    """Each point's calibrated prediction from the other points of its accelerator (uncalibrated if none)."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for point in points:
        sums[point.accelerator] += point.log_ratio
        counts[point.accelerator] += 1
    out = []
    for point in points:
        others = counts[point.accelerator] - 1
        scale = math.exp((sums[point.accelerator] - point.log_ratio) / others) if others else 1.0
        out.append(point.predicted_throughput_samples_per_s * scale)
    return out


def mape_pct(predicted: Sequence[float], observed: Sequence[float]) -> float | None:
    """Mean absolute percentage error of `predicted` against `observed`; None for no points."""
    if not observed:
        return None
    return 100.0 * sum(abs(p - o) / o for p, o in zip(predicted, observed)) / len(observed)

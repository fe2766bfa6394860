"""Prediction error, in one place: the absolute percentage error of each prediction and their mean (MAPE), in %.

Every accuracy figure perfmodel prints (held-out families, held-out GPUs, placements, collectives, calibration)
is computed here, so that one definition stands behind all of them: |predicted − measured| / measured × 100.
Where a step time is predicted and the reader uses the throughput it implies (a scheduler reads samples/s),
`throughput_ape` scores that throughput: on the step time, an answer k times too fast would count at most 100 %
however large k, and an optimistic model would look better than it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

Z80 = 1.2815515655446004  # the 90th percentile of a standard normal: p10 / p90 = median ∓ Z80 sd (an 80 % interval)


def ape_pct(predicted: ArrayLike, measured: ArrayLike) -> np.ndarray:
    """|predicted − measured| / measured × 100, element-wise."""
    pred = np.asarray(predicted, dtype=np.float64)
    meas = np.asarray(measured, dtype=np.float64)
    return np.abs(pred - meas) / meas * 100.0


def mape_pct(predicted: ArrayLike, measured: ArrayLike) -> float:
    """The mean of `ape_pct`; NaN for no points."""
    errors = ape_pct(predicted, measured)
    return float(errors.mean()) if errors.size else float("nan")


def mape_pct_or_none(predicted: Sequence[float], observed: Sequence[float]) -> float | None:
    """`mape_pct`, None for no points (what a JSON report says when there is nothing to measure)."""
    return mape_pct(predicted, observed) if len(observed) else None


def throughput_ape(predicted_ms: ArrayLike, measured_ms: ArrayLike) -> np.ndarray:
    """APE (a fraction) of the throughput a predicted step time implies, against the measured step's: the work per
    step cancels, so it is |measured_ms / predicted_ms − 1|. A step predicted twice too fast is 100 % off, one
    predicted twice too slow 50 %."""
    return np.abs(np.asarray(measured_ms, dtype=np.float64) / np.asarray(predicted_ms, dtype=np.float64) - 1.0)

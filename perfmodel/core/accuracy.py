"""Prediction error, in one place: the absolute percentage error of each prediction and their mean (MAPE), in %.

Every accuracy figure perfmodel prints (held-out families, held-out GPUs, placements, collectives, calibration)
is computed here, so that one definition stands behind all of them: |predicted − measured| / measured × 100.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike


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

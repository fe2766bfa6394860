"""The estimator contract every regressor follows (scikit-learn style), and what it learns from: `Sample`s.

A `Sample` (`perfmodel.features.sample`) is one profiled (or to-be-predicted) job run. Regressors:

- `__init__` stores settings only (no I/O, no training);
- `fit(samples) -> self` learns (seeded, reproducible);
- `predict(samples) -> IterationPrediction` has no side effects;
- `save(directory)` writes the artifact and a manifest (ordered feature names, normalisation, data hash, metrics,
  library versions); `load(directory)` reads them back, never unpickling, and predicts identically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from perfmodel.features.sample import Sample


@dataclass(frozen=True)
class IterationPrediction:
    """Per-sample predictions (arrays of len(samples)), all in ms. Totals are explicit sums:
    iteration = forward + backward + optimizer + overhead."""

    iter_time_ms: np.ndarray
    p10_ms: np.ndarray
    p90_ms: np.ndarray
    forward_ms: np.ndarray
    backward_ms: np.ndarray
    optimizer_ms: np.ndarray
    overhead_ms: np.ndarray


class Regressor(Protocol):
    name: str

    def fit(self, samples: Sequence[Sample]) -> Regressor: ...

    def predict(self, samples: Sequence[Sample]) -> IterationPrediction: ...

    def save(self, directory: Path) -> Path: ...

    @classmethod
    def load(cls, directory: Path) -> Regressor: ...

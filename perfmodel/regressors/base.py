"""The estimator contract every regressor follows (scikit-learn style), and what it learns from: `Sample`s.

A `Sample` is one profiled (or to-be-predicted) job run: the job's graph IR, the hardware it ran on, and, when it
was measured, the iteration time and the per-IR-node times of forward and backward. Regressors:

- `__init__` stores settings only (no I/O, no training);
- `fit(samples) -> self` learns (seeded, reproducible);
- `predict(samples) -> IterationPrediction` has no side effects;
- `save(directory)` writes the artifact and a manifest (ordered feature names, normalisation, data hash, metrics,
  library versions); `load(directory)` reads them back, never unpickling, and predicts identically.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from perfmodel.graph.ir import Graph
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import JobSpec

NodePhase = Literal["forward", "backward"]


@dataclass(frozen=True)
class Sample:
    spec: JobSpec
    graph: Graph
    hardware: HardwareSpec
    family: str
    iteration_time_ms: float | None = None  # measured median, None when predicting
    iteration_time_cv: float | None = None  # spread of the measurement (std/mean of the repeats)
    # measured self time per (IR node id, phase), summed over the aten calls attributed to the node; ms per step
    node_times_ms: Mapping[tuple[str, NodePhase], float] = field(default_factory=dict)
    unattributed_ms: float | None = None  # measured step time not attributed to any node (optimizer, glue)
    profile_id: int | None = None


@dataclass(frozen=True)
class IterationPrediction:
    """Per-sample predictions (arrays of len(samples)), all in ms. Totals are explicit sums:
    iteration = forward + backward + optimizer + overhead."""

    iteration_time_ms: np.ndarray
    p10_ms: np.ndarray
    p90_ms: np.ndarray
    forward_ms: np.ndarray
    backward_ms: np.ndarray
    optimizer_ms: np.ndarray
    overhead_ms: np.ndarray


class Regressor(Protocol):
    name: str

    def fit(self, samples: Sequence[Sample]) -> "Regressor": ...

    def predict(self, samples: Sequence[Sample]) -> IterationPrediction: ...

    def save(self, directory: Path) -> Path: ...

    @classmethod
    def load(cls, directory: Path) -> "Regressor": ...

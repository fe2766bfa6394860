"""What every regressor learns from and predicts for: a `Sample`, one profiled (or to-be-predicted) job run.

A sample holds the job's graph IR, the hardware it ran on, and, when it was measured, the iteration time and the
per-IR-node times of forward and backward. It lives here, below the regressors, because the feature builders
(`perfmodel.features.dataset`) make samples from profiles and the regressors consume them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from perfmodel.core.ir import Graph
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import JobSpec

NodePhase = Literal["forward", "backward"]


@dataclass(frozen=True)
class Sample:
    spec: JobSpec
    graph: Graph
    hardware: HardwareSpec
    family: str
    iter_time_ms: float | None = None  # measured median, None when predicting
    iter_time_cv: float | None = None  # spread of the measurement (std/mean of the repeats)
    # measured self time per (IR node id, phase), summed over the aten calls attributed to the node; ms per step
    node_times_ms: Mapping[tuple[str, NodePhase], float] = field(default_factory=dict)
    unattributed_ms: float | None = None  # measured step time not attributed to any node (optimizer, glue)
    profile_id: int | None = None

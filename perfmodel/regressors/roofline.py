"""The roofline baseline: no learning, every node at the hardware's peak.

- forward / backward: the sum over the graph's nodes (backward only for training graphs, and only for nodes with
  backward work) of `roofline_ms(flops, bytes read + written, hw)`: max(compute time at peak FLOP/s, memory time at
  peak bandwidth). Half-precision jobs (fp16, bf16, amp) use the hardware's fp16 peak where it has one.
- optimizer (training only): memory time of reading and writing every optimizer tensor once:
  2 × param_bytes × tensors, with tensors = 3 for SGD with momentum (weights, gradients, momentum) and 4 for
  Adam / AdamW (weights, gradients, two moments). Its FLOPs are left out (a few per element: memory-bound).
- overhead: 0. The interval is the point estimate (p10 = p90 = iteration): a roofline carries no uncertainty.

It is a lower bound by construction; the learned regressors correct it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from perfmodel.features.nodes import has_phase, node_cost, roofline_ms
from perfmodel.features.sample import Sample
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import Mode, OptimizerName, Precision
from perfmodel.regressors.base import IterationPrediction
from perfmodel.regressors.manifest import Manifest

OPTIMIZER_TENSORS: dict[OptimizerName, int] = {OptimizerName.sgd: 3, OptimizerName.adam: 4, OptimizerName.adamw: 4}
HALF_PRECISIONS = tuple(p for p in Precision if p.half_dtype is not None)


def compute_hardware(sample: Sample) -> HardwareSpec:
    """The hardware as the roofline sees it for this job: the fp16 peak in place of fp32 for half precision."""
    hw = sample.hardware
    if sample.spec.precision in HALF_PRECISIONS and hw.peak_fp16_gflops is not None:
        return hw.model_copy(update={"peak_fp32_gflops": hw.peak_fp16_gflops})
    return hw


def phase_roofline_ms(sample: Sample, phase: str) -> float:
    """Σ roofline_ms over the nodes doing work in `phase` (0 for backward of an inference graph)."""
    if phase == "backward" and sample.graph.mode != "train":
        return 0.0
    hw = compute_hardware(sample)
    total = 0.0
    for node in sample.graph.nodes:
        if has_phase(node, phase):
            flops, bytes_read, bytes_written = node_cost(node, phase)
            total += roofline_ms(flops, bytes_read + bytes_written, hw)
    return total


def optimizer_roofline_ms(sample: Sample) -> float:
    """Memory time of one optimizer step: read + write each optimizer tensor (0 for inference)."""
    if sample.spec.mode != Mode.train or sample.graph.mode != "train":
        return 0.0
    moved = 2 * sample.graph.totals.param_bytes * OPTIMIZER_TENSORS[sample.spec.optimizer]
    return roofline_ms(0, moved, sample.hardware)


class RooflineRegressor:
    """Analytic lower bound (see the module doc). `fit` learns nothing; predictions need no training data."""

    name = "roofline"

    def get_params(self) -> dict:
        """No settings: the roofline is fixed by the hardware spec."""
        return {}

    def fit(self, samples: Sequence[Sample]) -> RooflineRegressor:
        return self

    def predict(self, samples: Sequence[Sample]) -> IterationPrediction:
        forward = np.array([phase_roofline_ms(s, "forward") for s in samples], dtype=np.float64)
        backward = np.array([phase_roofline_ms(s, "backward") for s in samples], dtype=np.float64)
        optimizer = np.array([optimizer_roofline_ms(s) for s in samples], dtype=np.float64)
        overhead = np.zeros(len(samples), dtype=np.float64)
        iteration = forward + backward + optimizer + overhead
        return IterationPrediction(iter_time_ms=iteration, p10_ms=iteration.copy(), p90_ms=iteration.copy(),
                                   forward_ms=forward, backward_ms=backward, optimizer_ms=optimizer,
                                   overhead_ms=overhead)

    def save(self, directory: Path) -> Path:
        """Write the manifest (no artifact: nothing is learned); returns its path."""
        return Manifest(regressor=self.name, feature_names=(), settings={},
                        normalisation={"optimizer_tensors": {k.value: v for k, v in OPTIMIZER_TENSORS.items()}}
                        ).write(directory)

    @classmethod
    def load(cls, directory: Path) -> RooflineRegressor:
        Manifest.read_for(directory, cls.name)
        return cls()

    def __repr__(self) -> str:
        return "RooflineRegressor()"

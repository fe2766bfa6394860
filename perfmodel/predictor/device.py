"""Iteration time of a job on a catalog accelerator nobody profiled, from the per-op device model.

The job's graph is mapped to kernel rows (`graph_op_rows`: forward, and for training each node's backward GEMMs
and element-wise kernels), the promoted `xgb-device-ops` model predicts every row on the accelerator from its
spec sheet, and the iteration is the explicit sum

    forward (Σ forward rows) + backward (Σ backward rows) + optimizer + communication (0 on one device) + overhead (0)

The optimizer step is memory-bound: `OPTIMIZER_TENSOR_PASSES` fp32 passes over the parameters, predicted as
element-wise `add` kernels (each reads two tensors and writes one) of the parameter count. Kernel launch cost is
inside each op's predicted time (the model's floor), so no separate overhead is added.

The interval sums the rows' p10 and p90: the comonotone bound, since errors of one model on one device are
correlated. `extrapolated` is set when a row is (its dtype or the device's peak or bandwidth lies outside the
training data) or the precision is mixed (`amp`: rows are predicted as fp16 GEMMs and fp32 element-wise).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.errors import PerfmodelError
from perfmodel.features.graph import OPTIMIZER_TENSOR_PASSES
from perfmodel.jobs.spec import JobSpec
from perfmodel.predictor.device_ops import graph_op_rows
from perfmodel.predictor.memory import estimate_memory
from perfmodel.predictor.predict import Prediction
from perfmodel.units import samples_per_s

# the dtype rows are predicted in, per job precision
ROW_DTYPE = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "amp": "fp16"}
PASSES_PER_ADD_KERNEL = 3  # an `add` row reads 2 tensors and writes 1


def optimizer_rows(params: int, optimizer: str | None) -> pd.DataFrame:
    """The optimizer step as element-wise fp32 `add` rows over the parameters (none for inference)."""
    if not optimizer or params <= 0:
        return pd.DataFrame(columns=["op_class", "op_name", "dtype", "batch", "hidden", "phase"])
    kernels = math.ceil(OPTIMIZER_TENSOR_PASSES[optimizer] / PASSES_PER_ADD_KERNEL)
    hidden = 4096
    return pd.DataFrame({"op_class": "elementwise", "op_name": "add", "dtype": "fp32",
                         "batch": [max(math.ceil(params / hidden), 1)] * kernels, "hidden": hidden,
                         "phase": "optimizer"})


class DevicePredictor:
    """The promoted per-op device model (registry role `device-ops`) and the hardware catalog."""

    def __init__(self, regressor: Any, model_version: str, catalog: dict[str, Any]):
        self.regressor = regressor
        self.model_version = model_version
        self.catalog = catalog

    @classmethod
    def load(cls, ref: str | None = None, models_dir: Any = None) -> DevicePredictor:
        from perfmodel.hardware.catalog import load_catalog
        from perfmodel.registry.registry import ModelRegistry
        from perfmodel.regressors import load_regressor

        entry = ModelRegistry(models_dir).get(ref, role="device-ops")
        return cls(load_regressor(entry.path), entry.ref, load_catalog())

    def predict(self, spec: JobSpec, accelerator: str, *, graph: Any = None) -> Prediction:
        from perfmodel.graph import graph_for_job
        from perfmodel.hardware.catalog import get_accelerator

        hardware = get_accelerator(accelerator)
        if hardware.name not in self.catalog:
            raise PerfmodelError(f"accelerator {hardware.name!r} is not in this predictor's catalog")
        graph = graph if graph is not None else graph_for_job(spec)
        precision = spec.precision.value
        rows = graph_op_rows(graph, dtype=ROW_DTYPE[precision], mode=spec.mode.value)
        if precision == "amp":  # autocast: GEMMs in half precision, the rest in fp32
            rows = rows.assign(dtype=np.where(rows["op_class"].isin(["bmm", "linear", "conv2d"]), "fp16", "fp32"))
        optimizer = spec.optimizer.value if spec.mode.value == "train" else None
        rows = pd.concat([rows, optimizer_rows(graph.totals.params, optimizer)], ignore_index=True)
        rows = rows.assign(device=hardware.name)
        out = self.regressor.predict(rows, self.catalog)
        phase = rows["phase"].to_numpy()

        def total(values: np.ndarray, which: str) -> float:
            return float(values[phase == which].sum())

        breakdown = {"forward": total(out.latency_ms, "forward"), "backward": total(out.latency_ms, "backward"),
                     "optimizer": total(out.latency_ms, "optimizer"), "communication": 0.0, "overhead": 0.0}
        iteration_ms = sum(breakdown.values())
        reasons = []
        if out.extrapolated.any():
            outside = sorted(set(rows.loc[out.extrapolated, "op_class"]))
            reasons.append(f"{int(out.extrapolated.sum())} of {len(rows)} ops ({', '.join(outside)}) lie outside "
                           f"the model's training devices or dtypes on {hardware.name}")
        if precision == "amp":
            reasons.append("amp is predicted as fp16 GEMMs and fp32 element-wise ops")
        return Prediction(
            job=spec.name, job_key=spec.key(), accelerator=hardware.name, model_version=self.model_version,
            iteration_time_ms=iteration_ms, throughput_samples_per_s=samples_per_s(spec.batch_size, iteration_ms),
            interval_ms=(float(out.p10_ms.sum()), float(out.p90_ms.sum())), breakdown_ms=breakdown,
            peak_memory_bytes=estimate_memory(spec, graph).peak_bytes,
            extrapolated=bool(reasons), extrapolation_reasons=tuple(reasons),
        )

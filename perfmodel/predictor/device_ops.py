"""A graph's time on a device from the predicted latencies of its kernel rows.

The rows are the lowering's (`perfmodel.lowering.rows.graph_op_rows`: one row per kernel, forward and backward,
in the kernel-row schema of `perfmodel.lowering.ops`); a predictor of that schema (`predict_fn`: DataFrame -> ms
per row) gives the graph's forward and backward time as sums (`predict_graph_ms`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph
from perfmodel.lowering.rows import BACKWARD, FORWARD, graph_op_rows


def summed_ms(rows: pd.DataFrame, predicted_ms: np.ndarray | pd.Series) -> dict[str, float]:
    """{"forward": ms, "backward": ms}: the predicted latencies of the rows summed per phase."""
    ms = np.asarray(predicted_ms, dtype=np.float64)
    if ms.shape != (len(rows),):
        raise PerfmodelError(f"{ms.shape[0] if ms.ndim else 0} predictions for {len(rows)} rows")
    phase = rows["phase"].to_numpy()
    return {FORWARD: float(ms[phase == FORWARD].sum()), BACKWARD: float(ms[phase == BACKWARD].sum())}


PredictFn = Callable[[pd.DataFrame], np.ndarray]


def predict_graph_ms(graph: Graph, device_id: str, predict_fn: PredictFn,
                     catalog: Mapping[str, Any] | None = None, dtype: str = "fp32", mode: str | None = None, *,
                     attention_dropout: bool | None = None, rows: pd.DataFrame | None = None) -> dict[str, Any]:
    """The graph's predicted time on `device_id`: `predict_fn` (rows -> ms per row) over `graph_op_rows`.

    Returns forward_ms, backward_ms, total_ms, rows (how many), by_kind_ms {IR kind: {forward, backward}} and
    by_class_ms {op class: {forward, backward}}. `catalog`, when given, must know the device. `rows` skips the
    mapping (pass `graph_op_rows(...)` once to predict one graph on many devices)."""
    if catalog is not None and device_id not in catalog:
        raise PerfmodelError(f"device {device_id!r} is not in the hardware catalog given")
    if rows is None:
        rows = graph_op_rows(graph, dtype=dtype, mode=mode, attention_dropout=attention_dropout)
    rows = rows.assign(device=device_id)
    ms = np.asarray(predict_fn(rows), dtype=np.float64)
    totals = summed_ms(rows, ms)
    if not np.isfinite(ms).all():
        raise PerfmodelError(f"predict_fn returned {int((~np.isfinite(ms)).sum())} non-finite latencies")

    def by(column: str) -> dict[str, dict[str, float]]:
        table = pd.DataFrame({column: rows[column].to_numpy(), "phase": rows["phase"].to_numpy(), "ms": ms})
        sums = table.groupby([column, "phase"])["ms"].sum()
        return {key: {FORWARD: float(sums.get((key, FORWARD), 0.0)), BACKWARD: float(sums.get((key, BACKWARD), 0.0))}
                for key in sorted(table[column].unique())}

    return {"forward_ms": totals[FORWARD], "backward_ms": totals[BACKWARD],
            "total_ms": totals[FORWARD] + totals[BACKWARD], "rows": len(rows), "by_kind_ms": by("kind"),
            "by_class_ms": by("op_class")}


__all__ = ["BACKWARD", "FORWARD", "PredictFn", "graph_op_rows", "predict_graph_ms", "summed_ms"]

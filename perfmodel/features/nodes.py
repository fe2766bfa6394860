"""Per-node features: one row per (IR node, phase), named columns, in a fixed order saved with every model.

Only properties enter: the node's kind, its analytic cost for the phase (FLOPs, bytes), its shapes, and the
hardware's measured or spec-sheet figures (never a device id). `roofline_ms` (max of compute time at peak and
memory time at peak bandwidth) is included as a feature: learned models correct it rather than rediscover it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from perfmodel.core import cost
from perfmodel.core.ir import Graph, Node
from perfmodel.core.opkinds import OpKind
from perfmodel.graph.flops import DTYPE_BYTES
from perfmodel.hardware.spec import HardwareSpec

PHASES = ("forward", "backward")
KINDS = tuple(k.value for k in OpKind)

NODE_FEATURES: tuple[str, ...] = (
    *(f"kind_{k}" for k in KINDS),
    "is_backward",
    "log_flops",
    "log_bytes_read",
    "log_bytes_written",
    "log_params",
    "log_out_numel",
    "log_in0_numel",
    "log_in0_last_dim",
    "log_in0_first_dim",
    "n_inputs",
    "dtype_bytes",
    "log_intensity",  # FLOPs per byte moved
    "log_roofline_ms",
    "log_hw_peak_gflops",
    "log_hw_bandwidth_gb_s",
    "hw_compute_units",
    "hw_threads",
    "hw_is_gpu",
)


def _log(x: float) -> float:
    return math.log1p(max(x, 0.0))


def roofline_ms(flops: float, bytes_moved: float, hw: HardwareSpec) -> float:
    """Time at the fp32 peak and the memory bandwidth of `hw`: `core.cost.roofline_ms`, in ms."""
    return float(cost.roofline_ms(flops, bytes_moved, hw.peak_fp32_gflops, hw.memory_bandwidth_gb_s))


def node_cost(node: Node, phase: str) -> tuple[int, int, int]:
    """(flops, bytes_read, bytes_written) of a node in a phase."""
    if phase == "forward":
        return node.flops_fwd, node.bytes_read_fwd, node.bytes_written_fwd
    return node.flops_bwd, node.bytes_read_bwd, node.bytes_written_bwd


def has_phase(node: Node, phase: str) -> bool:
    """Whether a node does work in a phase (backward only for nodes with backward cost)."""
    if phase == "forward":
        return True
    return node.flops_bwd > 0 or node.bytes_read_bwd > 0 or node.bytes_written_bwd > 0


def hardware_features(hw: HardwareSpec) -> dict[str, float]:
    return {
        "log_hw_peak_gflops": math.log(hw.peak_fp32_gflops),
        "log_hw_bandwidth_gb_s": math.log(hw.memory_bandwidth_gb_s),
        "hw_compute_units": float(hw.compute_units),
        "hw_threads": float(hw.threads or hw.compute_units),
        "hw_is_gpu": 1.0 if hw.kind == "gpu" else 0.0,
    }


def node_row(node: Node, phase: str, hw_features: dict[str, float], hw: HardwareSpec) -> list[float]:
    flops, bytes_read, bytes_written = node_cost(node, phase)
    first = node.input_tensors[0] if node.input_tensors else None
    out = node.output_tensors[0] if node.output_tensors else None
    row = {f"kind_{k}": 0.0 for k in KINDS}
    row[f"kind_{node.kind.value}"] = 1.0
    moved = bytes_read + bytes_written
    row.update(
        is_backward=1.0 if phase == "backward" else 0.0,
        log_flops=_log(flops),
        log_bytes_read=_log(bytes_read),
        log_bytes_written=_log(bytes_written),
        log_params=_log(node.params),
        log_out_numel=_log(sum(t.numel for t in node.output_tensors)),
        log_in0_numel=_log(first.numel if first else 0),
        log_in0_last_dim=_log(first.shape[-1] if first and first.shape else 0),
        log_in0_first_dim=_log(first.shape[0] if first and first.shape else 0),
        n_inputs=float(len(node.input_tensors)),
        dtype_bytes=float(DTYPE_BYTES.get(out.dtype, 4) if out else 4),
        log_intensity=_log(flops / moved if moved else 0.0),
        log_roofline_ms=_log(roofline_ms(flops, moved, hw)),
        **hw_features,
    )
    return [row[name] for name in NODE_FEATURES]


def node_feature_matrix(graph: Graph, hw: HardwareSpec, phases: Sequence[str] = PHASES
                        ) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """Feature rows for every (node, phase) where the node does work in that phase (inference graphs: forward
    only), and the (node id, phase) key of each row. Columns are `NODE_FEATURES`, in order."""
    hw_features = hardware_features(hw)
    rows, keys = [], []
    for phase in phases:
        if phase == "backward" and graph.mode != "train":
            continue
        for node in graph.nodes:
            if has_phase(node, phase):
                rows.append(node_row(node, phase, hw_features, hw))
                keys.append((node.id, phase))
    matrix = np.asarray(rows, dtype=np.float32).reshape(len(rows), len(NODE_FEATURES))
    return matrix, keys

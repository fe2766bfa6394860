"""Per-job features: one row per sample from the graph's aggregate costs, the job's settings and the hardware.

Columns are `GRAPH_FEATURES`, in a fixed order saved with every model. Like the node features they hold
properties only (FLOPs, bytes, counts by op kind, batch size, optimizer, the hardware's figures), never ids. The
roofline terms (`roofline_parts_ms`) are the per-node roofline times summed per phase, plus the optimizer step
moving its parameter state once at memory bandwidth: learned models correct them rather than rediscover them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from perfmodel.core import cost
from perfmodel.core.ir import Graph
from perfmodel.core.opkinds import OpKind
from perfmodel.features.nodes import KINDS, hardware_features, has_phase, node_cost, roofline_ms
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import JobSpec

OPTIMIZERS = ("sgd", "adam", "adamw")
PRECISIONS = ("fp32", "fp16", "bf16", "amp")

# fp32 tensors one optimizer step reads and writes per parameter element: SGD with momentum reads param, grad and
# momentum and writes param and momentum (5); Adam/AdamW read param, grad, m, v and write param, m, v (7).
OPTIMIZER_TENSOR_PASSES = {"sgd": 5, "adam": 7, "adamw": 7}
PARAM_BYTES = 4  # optimizer state is fp32 (weights stay fp32 under amp)

# A nominal per-op dispatch/launch cost, used only to give "overhead" its share when a total is split by roofline
# proportions (`roofline_parts_ms`). Order of magnitude of a framework op dispatch on CPU and a kernel launch on GPU.
DISPATCH_MS_PER_OP = 0.005

GRAPH_FEATURES: tuple[str, ...] = (
    "is_train",
    *(f"optimizer_{o}" for o in OPTIMIZERS),
    *(f"precision_{p}" for p in PRECISIONS),
    "log_batch_size",
    "log_nodes",
    "log_compute_nodes",
    "log_param_nodes",
    "log_flops_fwd",
    "log_flops_bwd",
    "log_bytes_fwd",
    "log_bytes_bwd",
    "log_params",
    "log_activation_bytes",
    "log_flops_per_byte",
    *(f"log_nodes_{k}" for k in KINDS),
    *(f"log_flops_fwd_{k}" for k in KINDS),
    *(f"share_flops_{k}" for k in KINDS),
    "log_hw_peak_gflops",
    "log_hw_bandwidth_gb_s",
    "hw_compute_units",
    "hw_threads",
    "hw_is_gpu",
    "log_roofline_forward_ms",
    "log_roofline_backward_ms",
    "log_roofline_optimizer_ms",
    "log_roofline_ms",
)


def _log(x: float) -> float:
    return math.log1p(max(x, 0.0))


def optimizer_name(spec: JobSpec) -> str | None:
    """The optimizer a job steps, None for inference."""
    return spec.optimizer.value if spec.mode.value == "train" else None


def roofline_parts_ms(graph: Graph, hw: HardwareSpec, spec: JobSpec) -> dict[str, float]:
    """Roofline time of each part of an iteration, in ms: forward and backward (Σ per-node roofline), optimizer
    (the parameter state moved once at memory bandwidth), overhead (`DISPATCH_MS_PER_OP` per compute op)."""
    parts = {"forward": 0.0, "backward": 0.0}
    compute_ops = 0
    for node in graph.nodes:
        for phase in parts:
            if phase == "backward" and graph.mode != "train":
                continue
            if has_phase(node, phase):
                flops, bytes_read, bytes_written = node_cost(node, phase)
                parts[phase] += roofline_ms(flops, bytes_read + bytes_written, hw)
                compute_ops += node.kind != OpKind.view
    optimizer = optimizer_name(spec)
    optimizer_bytes = graph.totals.params * PARAM_BYTES * OPTIMIZER_TENSOR_PASSES[optimizer] if optimizer else 0
    parts["optimizer"] = float(cost.memory_ms(optimizer_bytes, hw.memory_bandwidth_gb_s))
    parts["overhead"] = compute_ops * DISPATCH_MS_PER_OP
    return parts


def graph_features(graph: Graph, hw: HardwareSpec, spec: JobSpec) -> dict[str, float]:
    """The named features of one job (keys: `GRAPH_FEATURES`)."""
    totals = graph.totals
    optimizer = optimizer_name(spec)
    bytes_fwd = totals.bytes_read_fwd + totals.bytes_written_fwd
    bytes_bwd = totals.bytes_read_bwd + totals.bytes_written_bwd
    flops = totals.flops_fwd + totals.flops_bwd
    compute_nodes = sum(1 for n in graph.nodes if n.kind != OpKind.view)
    param_nodes = sum(1 for n in graph.nodes if n.params > 0)
    parts = roofline_parts_ms(graph, hw, spec)
    row: dict[str, float] = {
        "is_train": 1.0 if graph.mode == "train" else 0.0,
        **{f"optimizer_{o}": 1.0 if optimizer == o else 0.0 for o in OPTIMIZERS},
        **{f"precision_{p}": 1.0 if spec.precision.family == p else 0.0 for p in PRECISIONS},
        "log_batch_size": math.log(spec.batch_size),
        "log_nodes": _log(totals.nodes),
        "log_compute_nodes": _log(compute_nodes),
        "log_param_nodes": _log(param_nodes),
        "log_flops_fwd": _log(totals.flops_fwd),
        "log_flops_bwd": _log(totals.flops_bwd),
        "log_bytes_fwd": _log(bytes_fwd),
        "log_bytes_bwd": _log(bytes_bwd),
        "log_params": _log(totals.params),
        "log_activation_bytes": _log(totals.activation_bytes),
        "log_flops_per_byte": _log(flops / (bytes_fwd + bytes_bwd) if bytes_fwd + bytes_bwd else 0.0),
        **{f"log_nodes_{k}": _log(totals.ops_by_kind.get(k, 0)) for k in KINDS},
        **{f"log_flops_fwd_{k}": _log(totals.flops_fwd_by_kind.get(k, 0)) for k in KINDS},
        **{f"share_flops_{k}": totals.flops_fwd_by_kind.get(k, 0) / totals.flops_fwd if totals.flops_fwd else 0.0
           for k in KINDS},
        **hardware_features(hw),
        "log_roofline_forward_ms": _log(parts["forward"]),
        "log_roofline_backward_ms": _log(parts["backward"]),
        "log_roofline_optimizer_ms": _log(parts["optimizer"]),
        "log_roofline_ms": _log(sum(parts.values())),
    }
    return row


def graph_feature_matrix(items: Sequence[tuple[Graph, HardwareSpec, JobSpec]]) -> np.ndarray:
    """One row per (graph, hardware, job spec); columns are `GRAPH_FEATURES`, in order."""
    rows = []
    for graph, hw, spec in items:
        features = graph_features(graph, hw, spec)
        rows.append([features[name] for name in GRAPH_FEATURES])
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(GRAPH_FEATURES))

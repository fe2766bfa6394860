"""Framework-neutral op graphs with analytic FLOPs and bytes, from PyTorch (`torch.export` on the meta device) or
from ONNX files.

    graph = graph_for_job(spec)      # a JobSpec of any source
    summarize(graph)                 # a dict for the CLI to print
    Graph.from_json(graph.to_json()) # the IR round-trips through JSON
"""

from __future__ import annotations

from typing import Any

from perfmodel.core.ir import SCHEMA_VERSION, Graph, GraphTotals, MoEInfo, Node, TensorMeta
from perfmodel.core.opkinds import OpKind, kind_of, kind_of_onnx
from perfmodel.graph.flops import COST_TABLE, OpCall, OpCost, op_cost
from perfmodel.graph.from_onnx import graph_from_onnx
from perfmodel.jobs.spec import GraphSource, JobSpec, OnnxSource

__all__ = [
    "COST_TABLE", "SCHEMA_VERSION", "Graph", "GraphTotals", "MoEInfo", "Node", "OpCall", "OpCost", "OpKind",
    "TensorMeta",
    "capture_graph", "graph_for_job", "graph_from_module", "graph_from_onnx", "kind_of", "kind_of_onnx", "op_cost",
    "summarize",
]

TOP_KINDS = 5

# torch is imported only when a PyTorch graph is asked for: `perfmodel.core.ir` and `.opkinds` stay light.
_LAZY = {"capture_graph": "perfmodel.graph.from_torch", "graph_from_module": "perfmodel.graph.from_torch"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def graph_for_job(spec: JobSpec) -> Graph:
    """The graph of any job: the IR itself for an IR source, read from the ONNX file for an ONNX source, captured
    with torch.export otherwise."""
    if isinstance(spec.source, GraphSource):
        return spec.source.parsed().model_copy(update={"job_id": spec.key()})
    if isinstance(spec.source, OnnxSource):
        graph = graph_from_onnx(spec.source.path, batch_size=spec.batch_size, seq_len=spec.seq_len, name=spec.name,
                                mode=spec.mode.value)
        return graph.model_copy(update={"job_id": spec.key()})
    from perfmodel.graph.from_torch import capture_graph

    return capture_graph(spec)


def summarize(graph: Graph) -> dict[str, Any]:
    """What the CLI prints about a graph: sizes, FLOPs forward/backward, bytes, and where the FLOPs go."""
    totals = graph.totals
    ranked = sorted(totals.flops_fwd_by_kind.items(), key=lambda kv: kv[1], reverse=True)
    top = [{"kind": kind, "flops_fwd": flops, "share": flops / totals.flops_fwd if totals.flops_fwd else 0.0}
           for kind, flops in ranked[:TOP_KINDS] if flops > 0]
    return {
        "name": graph.name,
        "source": graph.source,
        "mode": graph.mode,
        "nodes": totals.nodes,
        "params": totals.params,
        "param_bytes": totals.param_bytes,
        "activation_bytes": totals.activation_bytes,
        "flops_fwd": totals.flops_fwd,
        "flops_bwd": totals.flops_bwd,
        "flops_total": totals.flops_fwd + totals.flops_bwd,
        "bytes_read_fwd": totals.bytes_read_fwd,
        "bytes_written_fwd": totals.bytes_written_fwd,
        "bytes_read_bwd": totals.bytes_read_bwd,
        "bytes_written_bwd": totals.bytes_written_bwd,
        "ops_by_kind": dict(totals.ops_by_kind),
        "top_kinds_by_flops": top,
    }

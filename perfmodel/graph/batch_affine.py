"""One capture per model serves every batch size: a graph is affine in the batch.

A model's graph at batch b has the same nodes at every batch; what changes is numbers: every tensor dimension, FLOP
and byte count of a node is a + c·b (the batch multiplies the leading dimension, a sequence model's B·S rows, an
attention's B·H heads ...; weights and their gradients do not move). Two captures at batches b1 != b2 of the same
spec fix a and c for every number, and the graph at any batch is then arithmetic (`BatchAffine.at`), with no
capture. Where two captures differ in structure (other nodes, ops or kinds: a model that branches on its batch) there
is no affine model and every batch is captured (`affine` returns None).

The totals are recomputed from the nodes (`GraphTotals.from_nodes`); the model's parameters do not move with the
batch, and the whole-graph figures the nodes do not sum to (activation bytes, the saved-activation bytes memory
estimates use) are affine themselves.
`bench/batch_affine.py` checks every zoo model against a capture at a third batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfmodel.core.ir import Graph, GraphTotals, MoEInfo, TensorMeta

_NODE_NUMBERS = ("flops_fwd", "flops_bwd", "bytes_read_fwd", "bytes_written_fwd", "bytes_read_bwd",
                 "bytes_written_bwd", "params")


def _line(v1: int, v2: int, b1: int, b2: int, b: int) -> int:
    """The integer at batch `b` on the line through (b1, v1) and (b2, v2) (never below 0)."""
    return max(round(v1 + (v2 - v1) * (b - b1) / (b2 - b1)), 0)


def _same_structure(g1: Graph, g2: Graph) -> bool:
    if len(g1.nodes) != len(g2.nodes) or len(g1.inputs) != len(g2.inputs) or (g1.moe is None) != (g2.moe is None):
        return False
    for n1, n2 in zip(g1.nodes, g2.nodes):
        if (n1.id, n1.op, n1.kind, n1.inputs, n1.module) != (n2.id, n2.op, n2.kind, n2.inputs, n2.module):
            return False
        for t1, t2 in ((n1.input_tensors, n2.input_tensors), (n1.output_tensors, n2.output_tensors)):
            if len(t1) != len(t2) or any(len(a.shape) != len(b.shape) or a.dtype != b.dtype for a, b in zip(t1, t2)):
                return False
    return all(len(a.shape) == len(b.shape) and a.dtype == b.dtype for a, b in zip(g1.inputs, g2.inputs))


@dataclass(frozen=True)
class BatchAffine:
    """The graph of one spec at any batch, from its captures at two batches."""

    first: Graph
    second: Graph
    batch_first: int
    batch_second: int

    def _tensors(self, t1: tuple[TensorMeta, ...], t2: tuple[TensorMeta, ...], b: int) -> tuple[TensorMeta, ...]:
        b1, b2 = self.batch_first, self.batch_second
        return tuple(TensorMeta.model_construct(
            shape=tuple(_line(x, y, b1, b2, b) for x, y in zip(a.shape, c.shape)), dtype=a.dtype)
            if a.shape != c.shape else a for a, c in zip(t1, t2))

    def at(self, batch: int) -> Graph:
        """The graph at `batch` (the captured one at either captured batch)."""
        if batch == self.batch_first:
            return self.first
        if batch == self.batch_second:
            return self.second
        b1, b2 = self.batch_first, self.batch_second
        nodes = []
        for n1, n2 in zip(self.first.nodes, self.second.nodes):
            changed: dict[str, Any] = {k: _line(getattr(n1, k), getattr(n2, k), b1, b2, batch)
                                       for k in _NODE_NUMBERS if getattr(n1, k) != getattr(n2, k)}
            if n1.input_tensors != n2.input_tensors:
                changed["input_tensors"] = self._tensors(n1.input_tensors, n2.input_tensors, batch)
            if n1.output_tensors != n2.output_tensors:
                changed["output_tensors"] = self._tensors(n1.output_tensors, n2.output_tensors, batch)
            nodes.append(n1.model_copy(update=changed) if changed else n1)
        t1, t2 = self.first.totals, self.second.totals
        def whole(name: str) -> int | None:
            v1, v2 = getattr(t1, name), getattr(t2, name)
            return None if v1 is None or v2 is None else _line(v1, v2, b1, b2, batch)

        totals = GraphTotals.from_nodes(nodes, params=t1.params, param_bytes=t1.param_bytes,
                                        activation_bytes=whole("activation_bytes") or 0,
                                        saved_activation_bytes=whole("saved_activation_bytes"),
                                        saved_activation_bytes_amp=whole("saved_activation_bytes_amp"))
        moe = self.first.moe
        if moe is not None and self.second.moe is not None:
            moe = MoEInfo.model_construct(**{**moe.model_dump(), "tokens": _line(
                moe.tokens, self.second.moe.tokens, b1, b2, batch)})
        return self.first.model_copy(update={
            "nodes": tuple(nodes), "totals": totals, "moe": moe,
            "inputs": self._tensors(self.first.inputs, self.second.inputs, batch)})


AFFINE_TOLERANCE = 0.005  # a third capture's totals within 0.5 % of the affine model's: the model is trusted
_CHECKED = ("flops_fwd", "flops_bwd", "bytes_read_fwd", "bytes_written_fwd", "bytes_read_bwd", "bytes_written_bwd",
            "activation_bytes", "saved_activation_bytes", "saved_activation_bytes_amp")


def agrees(made: Graph, captured: Graph, tolerance: float = AFFINE_TOLERANCE) -> bool:
    """Whether an affine graph matches a capture at the same batch: every total within `tolerance`."""
    for name in _CHECKED:
        a, b = getattr(made.totals, name), getattr(captured.totals, name)
        if (a is None) != (b is None) or (a is not None and abs(a - b) > tolerance * max(abs(b), 1)):
            return False
    return len(made.nodes) == len(captured.nodes)


def affine(first: Graph, batch_first: int, second: Graph, batch_second: int) -> BatchAffine | None:
    """The affine model of two captures of one spec at different batches; None where their structure differs."""
    if batch_first == batch_second or not _same_structure(first, second):
        return None
    if batch_first > batch_second:
        first, second, batch_first, batch_second = second, first, batch_second, batch_first
    return BatchAffine(first, second, batch_first, batch_second)

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
from functools import cached_property
from typing import Any

import numpy as np

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

    @cached_property
    def _plan(self) -> _Plan:
        """What moves with the batch, found once: the node numbers that differ between the two captures and every
        tensor dimension that does, as flat arrays (`at` is then one vectorised line and the nodes' rebuild)."""
        numbers: list[tuple[int, str]] = []
        tensors: list[tuple[int, str, int]] = []  # (node or -1 for the graph's inputs, field, tensor index)
        dims1: list[int] = []
        dims2: list[int] = []
        sizes: list[int] = []
        def tensor_changes(node: int, field: str, t1: tuple[TensorMeta, ...], t2: tuple[TensorMeta, ...]) -> None:
            for k, (a, c) in enumerate(zip(t1, t2)):
                if a.shape != c.shape:
                    tensors.append((node, field, k))
                    dims1.extend(a.shape)
                    dims2.extend(c.shape)
                    sizes.append(len(a.shape))

        for i, (n1, n2) in enumerate(zip(self.first.nodes, self.second.nodes)):
            numbers.extend((i, k) for k in _NODE_NUMBERS if getattr(n1, k) != getattr(n2, k))
            if n1.input_tensors != n2.input_tensors:
                tensor_changes(i, "input_tensors", n1.input_tensors, n2.input_tensors)
            if n1.output_tensors != n2.output_tensors:
                tensor_changes(i, "output_tensors", n1.output_tensors, n2.output_tensors)
        tensor_changes(-1, "inputs", self.first.inputs, self.second.inputs)
        first = [getattr(self.first.nodes[i], k) for i, k in numbers]
        second = [getattr(self.second.nodes[i], k) for i, k in numbers]
        return _Plan(numbers, np.array(first, dtype=np.int64), np.array(second, dtype=np.int64), tensors,
                     np.array(dims1, dtype=np.int64), np.array(dims2, dtype=np.int64),
                     np.cumsum([0, *sizes]))

    def _line(self, first: np.ndarray, second: np.ndarray, batch: int) -> list[int]:
        t = (batch - self.batch_first) / (self.batch_second - self.batch_first)
        return np.maximum(np.rint(first + (second - first) * t), 0).astype(np.int64).tolist()

    def at(self, batch: int) -> Graph:
        """The graph at `batch` (the captured one at either captured batch)."""
        if batch == self.batch_first:
            return self.first
        if batch == self.batch_second:
            return self.second
        plan = self._plan
        changes: dict[int, dict[str, Any]] = {}
        for (i, name), value in zip(plan.numbers, self._line(plan.first, plan.second, batch)):
            changes.setdefault(i, {})[name] = value
        dims = self._line(plan.dims_first, plan.dims_second, batch)
        inputs = list(self.first.inputs)
        for (i, field, k), start, end in zip(plan.tensors, plan.offsets[:-1], plan.offsets[1:]):
            owner = inputs if i < 0 else changes.setdefault(i, {}).setdefault(
                field, list(getattr(self.first.nodes[i], field)))
            owner[k] = TensorMeta.model_construct(shape=tuple(dims[start:end]), dtype=owner[k].dtype)
        nodes = list(self.first.nodes)
        for i, changed in changes.items():
            for field in ("input_tensors", "output_tensors"):
                if field in changed:
                    changed[field] = tuple(changed[field])
            nodes[i] = nodes[i].model_copy(update=changed)
        b1, b2 = self.batch_first, self.batch_second
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
        return self.first.model_copy(update={"nodes": tuple(nodes), "totals": totals, "moe": moe,
                                             "inputs": tuple(inputs)})


@dataclass(frozen=True)
class _Plan:
    numbers: list[tuple[int, str]]  # (node, number) pairs that move
    first: np.ndarray
    second: np.ndarray
    tensors: list[tuple[int, str, int]]  # (node or -1: the graph's inputs, field, index) of tensors that move
    dims_first: np.ndarray  # their dimensions, flat
    dims_second: np.ndarray
    offsets: np.ndarray  # where each tensor's dimensions start in the flat arrays


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

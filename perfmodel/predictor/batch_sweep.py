"""Every batch of a job on one device in one pass: what a scheduler's batch sweep costs is one call of the per-op
model, not a graph, a row table and a composition per batch.

A job's graph is affine in its batch (`perfmodel.graph.batch_affine`): the same nodes at every batch, every
dimension, FLOP and byte count a + c·b. So are its kernel rows (`job_rows`: the same kernels, each shape column
affine) and what memory estimates read of it (`GraphBytes`). Two graphs of a job at batches b1 != b2 therefore fix,
at any batch b, with no graph made:

- `GraphLine`: each node's FLOPs and bytes (so the graph's totals and which nodes' backward may not beat their
  forward), and its `GraphBytes` (memory estimates, the repeated blocks' outputs);
- `RowLine`: the kernel rows of the job on one device math table, each distinct kernel once (a ResNet-50 step has
  442 kernels of 130 shapes; a BERT step 638 of 59), their shapes at b by the line through b1 and b2, rounded as
  a graph made at b rounds them.

`RowLine.of` checks the line against the rows of the job's graph at a third batch and refuses (None) where the
rows differ in anything but their shapes, or where the kernels whose shapes are off the line by more than the
anchors' rounding explains and 0.5 % hold more than 0.1 % of the step's FLOPs or bytes (a model that branches on its
batch): such a job is composed one batch at a time (`bench/batch_affine.py` lists them: SSD300, WaveGlow, Gavel's
recommendation and A3C jobs).

`DevicePredictor.predict_composed_sweeps` prices the distinct kernels of every batch of every sweep in one call of
the per-op model and composes each step with the same arithmetic as `predict_composed`
(`gpu_iteration.backward_factors`, `host_bound_steps`, `composition.composition_feature_arrays`), vectorised over
the batches; over the zoo, the step from the lines is within 0.007 % of the step from a capture at that batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from perfmodel.core.ir import Graph
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import JobSpec, Precision
from perfmodel.lowering.ops import SHAPE_COLUMNS, op_work, own_kernel_parts
from perfmodel.predictor.gpu_iteration import (
    cuda_core_conv_rows,
    fuses_attention,
    heavy_nodes,
    job_rows,
    row_nodes,
    transposes_layout,
)
from perfmodel.predictor.math_modes import group_of, resolved_table, row_maths
from perfmodel.predictor.memory import GraphBytes

ROW_TOLERANCE = 0.005  # a shape off the line by more than its rounding explains and this share is off the line
# kernels off the line are tolerated while they hold at most this share of the step's FLOPs and bytes (small
# element-wise kernels whose row shape rounds a size: RoBERTa's position ids, Swin's window masks)
OFF_LINE_WORK_SHARE = 0.001
_NODE_NUMBERS = ("flops_fwd", "flops_bwd", "bytes_read_fwd", "bytes_written_fwd", "bytes_read_bwd",
                 "bytes_written_bwd")
# the columns a kernel row is priced by besides its shape and device (`perfmodel.features.device_ops`)
_PRICED = ("op_class", "op_name", "dtype", "math", "launch")


def line(first: np.ndarray, second: np.ndarray, batch_first: int, batch_second: int,
         batches: np.ndarray) -> np.ndarray:
    """Integers at each of `batches` on the line through (batch_first, first) and (batch_second, second), rounded
    half to even and never below 0 (`batch_affine._line`): shape (batches, *first.shape)."""
    t = (np.asarray(batches, dtype=np.float64) - batch_first) / (batch_second - batch_first)
    t = t.reshape(-1, *([1] * np.ndim(first)))
    return np.maximum(np.rint(first + (np.asarray(second, dtype=np.float64) - first) * t), 0).astype(np.int64)


@dataclass(frozen=True)
class GraphLine:
    """A job's graph at any batch, as far as composing its step and estimating its memory read it."""

    first: Graph
    second: Graph
    batch_first: int
    batch_second: int

    @classmethod
    def of(cls, first: Graph, batch_first: int, second: Graph, batch_second: int) -> GraphLine | None:
        """None where the two graphs differ in nodes or one has experts (their routing is not arithmetic here)."""
        if (batch_first == batch_second or len(first.nodes) != len(second.nodes) or first.moe is not None
                or second.moe is not None or first.totals.params != second.totals.params
                or any(a.id != b.id for a, b in zip(first.nodes, second.nodes))):
            return None
        return cls(first, second, batch_first, batch_second)

    @cached_property
    def _numbers(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return {name: (np.array([getattr(n, name) for n in self.first.nodes], dtype=np.int64),
                       np.array([getattr(n, name) for n in self.second.nodes], dtype=np.int64))
                for name in _NODE_NUMBERS}

    def nodes_at(self, name: str, batches: np.ndarray) -> np.ndarray:
        """A node number (`flops_fwd`, ...) of every node at each batch: (batches, nodes)."""
        a, b = self._numbers[name]
        return line(a, b, self.batch_first, self.batch_second, batches)

    def heavy(self, batches: np.ndarray) -> np.ndarray:
        """`gpu_iteration.heavy_nodes` at each batch: (batches, nodes)."""
        return heavy_nodes(self.nodes_at("flops_fwd", batches), self.nodes_at("flops_bwd", batches))

    def flops_and_bytes(self, batches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The graph's FLOPs and bytes (forward + backward) at each batch, summed over its nodes as a graph made at
        that batch sums them."""
        flops = self.nodes_at("flops_fwd", batches).sum(axis=1) + self.nodes_at("flops_bwd", batches).sum(axis=1)
        bytes_ = sum(self.nodes_at(name, batches).sum(axis=1) for name in _NODE_NUMBERS[2:])
        return flops.astype(np.float64), np.asarray(bytes_, dtype=np.float64)

    @property
    def params(self) -> int:
        return self.first.totals.params

    def graph_bytes(self, precision: Precision, batch: int) -> GraphBytes:
        """What memory estimates read of the graph at `batch` (`GraphBytes`)."""
        if precision not in self._bytes:
            self._bytes[precision] = (GraphBytes.of(self.first, precision), GraphBytes.of(self.second, precision))
        first, second = self._bytes[precision]
        return first.between(second, self.batch_first, self.batch_second, batch)

    @cached_property
    def _bytes(self) -> dict[Precision, tuple[GraphBytes, GraphBytes]]:
        return {}  # the two graphs' `GraphBytes` per precision, walked once each


@dataclass(frozen=True)
class RowLine:
    """A job's kernel rows on devices of one math table at any batch: the rows at `batch_first` (their order,
    nodes and phases hold at every batch) and each distinct kernel's shape at both batches."""

    rows: pd.DataFrame
    codes: np.ndarray  # each row's distinct kernel
    kernels: pd.DataFrame  # the distinct kernels' priced columns (`_PRICED`, and `part` where the part runs a kernel
    # of its own: `lowering.ops.own_kernel_parts`)
    first: np.ndarray  # (kernels, SHAPE_COLUMNS) at batch_first
    second: np.ndarray
    batch_first: int
    batch_second: int
    nodes: np.ndarray  # `row_nodes`
    cuda_core: np.ndarray  # the rows of CUDA-core convolutions (`cuda_core_conv_rows`: `CUDA_CORE_CONV_MATH`)

    @classmethod
    def of(cls, spec: JobSpec, graphs: GraphLine, hardware: HardwareSpec, check: Graph, check_batch: int
           ) -> RowLine | None:
        """The line through `spec`'s rows on `hardware` at the two batches of `graphs`, checked against the rows of
        `check` (its graph at `check_batch`); None where the rows differ in anything but their shapes, or a shape is
        off the line."""
        b1, b2 = graphs.batch_first, graphs.batch_second
        first = job_rows(spec.model_copy(update={"batch_size": b1}), graphs.first, hardware)
        second = job_rows(spec.model_copy(update={"batch_size": b2}), graphs.second, hardware)
        third = job_rows(spec.model_copy(update={"batch_size": check_batch}), check, hardware)
        fixed = [c for c in first.columns if c not in SHAPE_COLUMNS]
        if not (len(first) == len(second) == len(third) and first[fixed].equals(second[fixed])
                and first[fixed].equals(third[fixed])):
            return None
        s1, s2, s3 = (f[list(SHAPE_COLUMNS)].fillna(0).to_numpy(dtype=np.int64) for f in (first, second, third))
        made = line(s1, s2, b1, b2, np.array([check_batch]))[0]
        off = np.abs(made - s3)
        # what rounding explains: each shape rounds a size (by up to one unit) at both anchors and at the check
        t = (check_batch - b1) / (b2 - b1)
        rounding = abs(1 - t) + abs(t) + 1
        off_rows = ((off > rounding) & (off > ROW_TOLERANCE * np.abs(s3))).any(axis=1)
        if off_rows.any() and _share_of_work(third, made, off_rows) > OFF_LINE_WORK_SHARE:
            return None
        return cls._of_rows(first, s1, s2, b1, b2, row_nodes(first, graphs.first),
                             cuda_core_conv_rows(first, graphs.first))

    @classmethod
    def _of_rows(cls, rows: pd.DataFrame, s1: np.ndarray, s2: np.ndarray, b1: int, b2: int, nodes: np.ndarray,
                 cuda_core: np.ndarray) -> RowLine:
        """The line of `rows` whose shapes are `s1` at `b1` and `s2` at `b2` (one per row), each distinct kernel
        once."""
        priced = rows[list(_PRICED)].astype(object).reset_index(drop=True).assign(part=own_kernel_parts(rows))
        keys = pd.MultiIndex.from_frame(pd.concat([priced, pd.DataFrame(np.hstack([s1, s2]))], axis=1))
        codes, unique = pd.factorize(keys)
        picks = np.zeros(len(unique), dtype=np.intp)
        picks[codes[::-1]] = np.arange(len(codes))[::-1]  # each kernel's first row
        return cls(rows=rows, codes=codes.astype(np.intp),
                   kernels=priced.iloc[picks].reset_index(drop=True), first=s1[picks],
                   second=s2[picks], batch_first=b1, batch_second=b2, nodes=nodes, cuda_core=cuda_core)

    def in_maths(self, precision: Precision, hardware: HardwareSpec) -> RowLine:
        """The same job's line in another float32 precision (`math_modes.FASTER_FLOAT32`: the same kernels and
        shapes, each group in that precision's math, a CUDA-core convolution in `CUDA_CORE_CONV_MATH`): what
        `RowLine.of` makes for it, without making its rows from the graphs again."""
        rows = self.rows.assign(math=row_maths(self.rows["kind"], self.cuda_core, resolved_table(precision, hardware)))
        return RowLine._of_rows(rows, self.first[self.codes], self.second[self.codes], self.batch_first,
                                self.batch_second, self.nodes, self.cuda_core)

    def kernels_at(self, batches: np.ndarray, device: str) -> pd.DataFrame:
        """The distinct kernels at each batch on `device`, batch-major: (batches x kernels) rows in the regressor's
        schema."""
        n = len(self.kernels)
        shapes = line(self.first, self.second, self.batch_first, self.batch_second, batches).reshape(-1, len(
            SHAPE_COLUMNS))
        columns = {name: np.tile(self.kernels[name].to_numpy(dtype=object), len(batches))
                   for name in (*_PRICED, "part")}
        columns.update({name: shapes[:, i] for i, name in enumerate(SHAPE_COLUMNS)})
        columns["device"] = np.full(n * len(batches), device, dtype=object)
        return pd.DataFrame(columns)


def _share_of_work(rows: pd.DataFrame, shapes: np.ndarray, off: np.ndarray) -> float:
    """The largest share of the step's FLOPs or bytes that the `off` rows hold, in `rows` or with `shapes`."""
    made = rows.copy()
    made[list(SHAPE_COLUMNS)] = shapes
    share = 0.0
    for work in (op_work(rows), op_work(made)):
        for amount in (work.flops, work.bytes_read + work.bytes_written):
            share = max(share, float(amount[off].sum()) / max(float(amount.sum()), 1.0))
    return share


def table_key(precision: Precision, hardware: HardwareSpec) -> tuple[tuple[str, str, str], ...]:
    """What a job's rows depend on of a device: the dtype and math of each op group (`resolved_table`), whether
    its convolutions are transposed to NHWC and back (`gpu_iteration.transposes_layout`), and whether its attention
    runs fused (`gpu_iteration.fuses_attention`)."""
    table = resolved_table(precision, hardware)
    transposed = transposes_layout(hardware, table[group_of("conv")].math)
    return (*sorted((group, entry.dtype, entry.math) for group, entry in table.items()),
            ("conv", "layout", "nhwc" if transposed else "nchw"),
            ("attention", "kernel", "fused" if fuses_attention(hardware) else "math"))


@dataclass(frozen=True)
class Sweep:
    """One job on one device at several batches: the job at each batch (`specs`), its rows and graph lines."""

    specs: Sequence[JobSpec]
    accelerator: str
    rows: RowLine
    graphs: GraphLine

    @property
    def batches(self) -> np.ndarray:
        return np.array([s.batch_size for s in self.specs], dtype=np.int64)


__all__ = ["GraphLine", "RowLine", "Sweep", "line", "table_key"]

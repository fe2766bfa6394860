"""The kernel-row schema, its op-class vocabulary, and the work (FLOPs, bytes) and roofline of a row.

A kernel row is one row of a DataFrame whose columns are `op_class`, `op_name`, `dtype` (fp32, tf32, fp16, bf16,
fp8, int8), optionally `math` and `device` (a catalog id), and the shape columns `SHAPE_COLUMNS` (0 where the op
has none). It is the schema of NeuSight's op sweeps, of `perfmodel hw bench`, and of the rows an IR graph lowers to
(`perfmodel.lowering.rows`). `op_work` gives its FLOPs and bytes from a table of one function per op class;
`op_roofline_ms` its roofline time on its device (`perfmodel.core.cost.roofline_ms`, at the peak of the row's math).

GEMM shapes follow NeuSight's sweep files: `bmm` is B × (M×K · K×N); `linear` is a (B·M)×K input times an N×K
weight. A conv is 2-D, square (`input_size`, `kernel_size`), NCHW.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from perfmodel.core import cost
from perfmodel.core.errors import PerfmodelError
from perfmodel.hardware.impute import imputed
from perfmodel.hardware.math import peak_gflops
from perfmodel.hardware.spec import HardwareSpec

# the op classes of kernel rows (a subset of the measured op classes, `perfmodel.profilers.external.OpClass`)
RowOpClass = Literal["bmm", "linear", "conv2d", "elementwise", "softmax", "layernorm"]

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}

# the op classes the cross-device regressors learn, and how a row of each describes its shape
GEMM_CLASSES: tuple[RowOpClass, ...] = ("bmm", "linear", "conv2d")
VECTOR_CLASSES: tuple[RowOpClass, ...] = ("elementwise", "softmax", "layernorm")
OP_CLASSES = GEMM_CLASSES + VECTOR_CLASSES
# NeuSight's OPName -> op class: one table for imports (perfmodel.importers.neusight) and for predictions from
# NeuSight-schema op tables (perfmodel.predictor.op_table)
NEUSIGHT_ELEMENTWISE_OPS = frozenset({"add", "addu", "mul", "mulu", "div", "divu", "pow", "powu", "relu", "gelu",
                                      "tanh"})
NEUSIGHT_OP_CLASS: Mapping[str, RowOpClass] = {
    "bmm": "bmm", "linear": "linear", "conv": "conv2d", "ln": "layernorm", "softmax": "softmax",
    **dict.fromkeys(NEUSIGHT_ELEMENTWISE_OPS, "elementwise"),
}

# element-wise ops by how many tensors of B·H elements they read, and FLOPs per element (NeuSight's op names;
# the `u` suffix is the tensor-with-scalar variant)
ELEMENTWISE_READS: dict[str, int] = {"add": 2, "mul": 2, "div": 2, "pow": 2, "sub": 2,
                                     "addu": 1, "mulu": 1, "divu": 1, "powu": 1, "relu": 1, "gelu": 1, "tanh": 1,
                                     "maxpool": 2, "maxpoolu": 1,  # a max pool's memory rows, as `add` and `addu`
                                     "silu": 1, "sigmoid": 1, "gelu_grad": 2}  # as `mulu`, `mulu` and `mul`
# a max pool's rows (`perfmodel.lowering.rows`): the memory row it is priced as -> its own name, of the same work
MAX_POOL_ROW_NAMES: dict[str, str] = {"add": "maxpool", "addu": "maxpoolu"}
MAX_POOL_ROWS = frozenset(MAX_POOL_ROW_NAMES.values())
# the rows whose kernel evaluates an exponential, erf or tanh per element (a GPU's memory-bound passes all the same;
# a CPU's take 4-14x an addition's time)
TRANSCENDENTAL_ROWS = frozenset({"gelu", "tanh", "silu", "sigmoid", "gelu_grad"})
ELEMENTWISE_FLOPS: dict[str, float] = {"pow": 10.0, "powu": 10.0, "gelu": 14.0, "tanh": 10.0}
DEFAULT_ELEMENTWISE_READS = 1
DEFAULT_ELEMENTWISE_FLOPS = 1.0
SOFTMAX_FLOPS_PER_ELEMENT = 5.0
LAYERNORM_FLOPS_PER_ELEMENT = 8.0

_GEMM = {"batch": ("B",), "m": ("M",), "n": ("N",), "k": ("K",)}
_VECTOR = {"batch": ("B",), "hidden": ("H",)}
# NeuSight's shape columns of each op class: {row column: the NeuSight column names it may have (the first one a
# table has is read)}; one table for the importer of the sweeps and for user op tables (perfmodel.predictor.op_table)
NEUSIGHT_SHAPE_SOURCES: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "bmm": _GEMM,
    "linear": _GEMM,
    "conv2d": {"batch": ("B",), "in_channels": ("Input_Channel",), "out_channels": ("Output_Channel",),
               "kernel_size": ("Kernel_Szie", "Kernel_Size"), "input_size": ("Input_Size",), "stride": ("Stride",),
               "padding": ("Padding",)},
    "elementwise": _VECTOR,
    "softmax": _VECTOR,
    "layernorm": _VECTOR,
}

SHAPE_COLUMNS = ("batch", "m", "n", "k", "hidden", "in_channels", "out_channels", "kernel_size", "input_size",
                 "stride", "padding")
# who launches a row's kernel (a row's `launch`): eager PyTorch, one op at a time (what the per-op model's
# measurements timed), a library call that runs a sequence of kernels back to back (cuDNN's recurrent steps), or one
# GEMM of a fused kernel whose intermediate never leaves the chip (a fused attention's QKᵀ and PV: the scores stay in
# registers and shared memory; `perfmodel.predictor.gpu_iteration.on_chip_scale`)
EAGER, LIBRARY, FUSED = "eager", "library", "fused"


@dataclass(frozen=True)
class OpWork:
    """FLOPs and bytes of every row, and the GEMM it is (for wave counts)."""

    flops: np.ndarray
    bytes_read: np.ndarray
    bytes_written: np.ndarray
    gemm_m: np.ndarray  # the (M, N) of the output of the GEMM an op is (B folded into M); 0 for vector ops
    gemm_n: np.ndarray
    gemm_batch: np.ndarray
    elements_written: np.ndarray  # output elements (the GEMM's M x N x batch; a vector op's B x H)


def _col(ops: pd.DataFrame, name: str) -> np.ndarray:
    if name not in ops:
        return np.zeros(len(ops))
    return pd.to_numeric(ops[name], errors="coerce").fillna(0).to_numpy(dtype=np.float64)


def _bmm(ops: pd.DataFrame, e: np.ndarray) -> OpWork:
    b, m, n, k = (np.maximum(_col(ops, c), 1) for c in ("batch", "m", "n", "k"))
    return OpWork(2 * b * m * n * k, e * b * (m * k + k * n), e * b * m * n, m, n, b, b * m * n)


def _linear(ops: pd.DataFrame, e: np.ndarray) -> OpWork:
    b, m, n, k = (np.maximum(_col(ops, c), 1) for c in ("batch", "m", "n", "k"))
    return OpWork(2 * b * m * n * k, e * (b * m * k + n * k), e * b * m * n, b * m, n, np.ones_like(b), b * m * n)


def conv_output_size(input_size: np.ndarray, kernel_size: np.ndarray, stride: np.ndarray,
                     padding: np.ndarray) -> np.ndarray:
    return np.maximum((input_size + 2 * padding - kernel_size) // np.maximum(stride, 1) + 1, 1)


def _conv2d(ops: pd.DataFrame, e: np.ndarray) -> OpWork:
    b = np.maximum(_col(ops, "batch"), 1)
    cin, cout = np.maximum(_col(ops, "in_channels"), 1), np.maximum(_col(ops, "out_channels"), 1)
    size, kernel = np.maximum(_col(ops, "input_size"), 1), np.maximum(_col(ops, "kernel_size"), 1)
    out = conv_output_size(size, kernel, np.maximum(_col(ops, "stride"), 1), _col(ops, "padding"))
    m, n, k = b * out * out, cout, cin * kernel * kernel  # implicit GEMM
    return OpWork(2 * m * n * k, e * (b * cin * size * size + cout * k), e * m * n, m, n, np.ones_like(b), m * n)


def _elements(ops: pd.DataFrame) -> np.ndarray:
    return np.maximum(_col(ops, "batch"), 1) * np.maximum(_col(ops, "hidden"), 1)


def _elementwise(ops: pd.DataFrame, e: np.ndarray) -> OpWork:
    numel = _elements(ops)
    names = ops["op_name"].astype(str) if "op_name" in ops else pd.Series([""] * len(ops))
    reads = names.map(lambda s: ELEMENTWISE_READS.get(s, DEFAULT_ELEMENTWISE_READS)).to_numpy(dtype=np.float64)
    flops = names.map(lambda s: ELEMENTWISE_FLOPS.get(s, DEFAULT_ELEMENTWISE_FLOPS)).to_numpy(dtype=np.float64)
    zero = np.zeros(len(ops))
    return OpWork(flops * numel, e * reads * numel, e * numel, zero, zero, zero, numel)


def _row_op(flops_per_element: float, extra_reads_per_row: float) -> Callable[[pd.DataFrame, np.ndarray], OpWork]:
    def work(ops: pd.DataFrame, e: np.ndarray) -> OpWork:
        numel = _elements(ops)
        hidden = np.maximum(_col(ops, "hidden"), 1)
        zero = np.zeros(len(ops))
        return OpWork(flops_per_element * numel, e * (numel + extra_reads_per_row * hidden), e * numel, zero, zero,
                      zero, numel)
    return work


OP_WORK: dict[str, Callable[[pd.DataFrame, np.ndarray], OpWork]] = {
    "bmm": _bmm,
    "linear": _linear,
    "conv2d": _conv2d,
    "elementwise": _elementwise,
    "softmax": _row_op(SOFTMAX_FLOPS_PER_ELEMENT, 0.0),
    "layernorm": _row_op(LAYERNORM_FLOPS_PER_ELEMENT, 2.0),  # + weight and bias
}


def dtype_bytes(dtypes: pd.Series) -> np.ndarray:
    unknown = sorted(set(dtypes) - set(DTYPE_BYTES))
    if unknown:
        raise PerfmodelError(f"unknown dtype(s) {unknown}; known: {sorted(DTYPE_BYTES)}")
    return dtypes.map(DTYPE_BYTES).to_numpy(dtype=np.float64)


def op_work(ops: pd.DataFrame) -> OpWork:
    """FLOPs and bytes of every row, by its `op_class` (rows of any class `OP_WORK` knows)."""
    unknown = sorted(set(ops["op_class"]) - set(OP_WORK))
    if unknown:
        raise PerfmodelError(f"no work model for op class(es) {unknown}; known: {sorted(OP_WORK)}")
    e = dtype_bytes(ops["dtype"] if "dtype" in ops else pd.Series(["fp32"] * len(ops), index=ops.index))
    fields = {name: np.zeros(len(ops)) for name in ("flops", "bytes_read", "bytes_written", "gemm_m", "gemm_n",
                                                     "gemm_batch", "elements_written")}
    for op_class, work_of in OP_WORK.items():
        mask = (ops["op_class"] == op_class).to_numpy()
        if mask.any():
            work = work_of(ops[mask], e[mask])
            for name in fields:
                fields[name][mask] = getattr(work, name)
    return OpWork(**fields)


def fused_rows(ops: pd.DataFrame) -> np.ndarray:
    """Which rows are a GEMM of a fused kernel (launch `FUSED`)."""
    if "launch" not in ops or not len(ops):
        return np.zeros(len(ops), dtype=bool)
    return (ops["launch"] == FUSED).to_numpy()


def moved_bytes(ops: pd.DataFrame, work: OpWork) -> np.ndarray:
    """Bytes each row moves through device memory: what it reads and writes, except that a fused kernel's GEMM
    (`fused_rows`) only reads its operands (q, k, v and the output's width; its scores stay on chip)."""
    return np.where(fused_rows(ops), work.bytes_read, work.bytes_read + work.bytes_written)


def row_maths(ops: pd.DataFrame) -> pd.Series:
    """The math of every row: its `math` column where given (a job's rows: `perfmodel.predictor.math_modes`), else
    its dtype (a measurement's: fp32 rows ran in fp32, half rows on tensor cores)."""
    dtypes = ops["dtype"] if "dtype" in ops else pd.Series(["fp32"] * len(ops), index=ops.index)
    if "math" not in ops:
        return dtypes
    return ops["math"].where(ops["math"].notna(), dtypes)


# cuDNN's and MIOpen's Winograd kernels compute a 3 x 3 stride-1 convolution in fp32 with fewer multiplies than the
# direct convolution `op_work` counts: F(4x4, 3x3) does 36 per 16 outputs against 144, 4x fewer (Lavin and Gray,
# "Fast Algorithms for Convolutional Neural Networks", 2016). Such a kernel can run faster than its direct FLOPs at
# the fp32 peak allow: 16 % of NeuSight's fp32 3 x 3 convolution rows on five GPUs and 37 % of DeepBench's on ten
# ran so (down to 0.42 of that roofline; Maxwell to Ampere, and AMD's GCN), where no row of any other shape did.
# The least arithmetic of the algorithms a library may pick is what bounds a kernel's time from below, so these rows'
# compute roofline is the direct one over this. Tensor-core maths (TF32, fp16, bf16) run implicit GEMMs: their rows
# keep the direct count. So does an architecture no measured row shows it on (`WINOGRAD_UNMEASURED`: Kepler; chosen
# after seeing Gavel's K80 steps answered faster with it, which no measurement here supports or refutes).
WINOGRAD_MAX_REDUCTION = 4.0
WINOGRAD_MATHS = frozenset({"fp32"})  # the maths a Winograd kernel runs in (the CUDA cores')
WINOGRAD_UNMEASURED = frozenset({"kepler"})


# the parts of a step whose kernel is not the forward kernel of the row's shape: a depthwise convolution's input and
# weight gradients (oneDNN's take 2-45x the forward on a CPU; `perfmodel.regressors.adaptation.PART_GROUPS`)
OWN_KERNEL_PARTS = ("dX", "dW")


def own_kernel_parts(ops: pd.DataFrame) -> np.ndarray:
    """Each row's part where the row runs a kernel of its own (a depthwise convolution's gradient:
    `OWN_KERNEL_PARTS`), None elsewhere: what tells such rows apart from the forward kernel of the same shape."""
    out = np.full(len(ops), None, dtype=object)
    if "part" in ops and len(ops):
        parts = ops["part"].to_numpy(dtype=object)
        own = depthwise_rows(ops) & np.isin(parts, OWN_KERNEL_PARTS)
        out[own] = parts[own]
    return out


def depthwise_rows(ops: pd.DataFrame) -> np.ndarray:
    """Which rows are depthwise convolutions: conv2d rows of one input and one output channel, as
    `perfmodel.lowering.rows` lowers a depthwise convolution (its groups folded into the batch, a channel multiplier
    of 1)."""
    if not len(ops) or "in_channels" not in ops or "out_channels" not in ops:
        return np.zeros(len(ops), dtype=bool)
    return ((ops["op_class"] == "conv2d").to_numpy() & (_col(ops, "in_channels") == 1)
            & (_col(ops, "out_channels") == 1))


def winograd_rows(ops: pd.DataFrame, architectures: Sequence[str | None] | np.ndarray) -> np.ndarray:
    """Which rows are convolutions a library may run as Winograd: conv2d, 3 x 3, stride 1, in fp32 math, on a device
    whose architecture (`architectures`, one per row) is not `WINOGRAD_UNMEASURED` (a row carries no groups or
    dilation: a lowered convolution of another kind is a 3 x 3 stride-1 row all the same)."""
    if not len(ops) or "kernel_size" not in ops or "stride" not in ops:
        return np.zeros(len(ops), dtype=bool)
    measured = ~np.isin(np.asarray(architectures, dtype=object), list(WINOGRAD_UNMEASURED))
    return ((ops["op_class"] == "conv2d").to_numpy() & (_col(ops, "kernel_size") == 3) & (_col(ops, "stride") == 1)
            & row_maths(ops).isin(WINOGRAD_MATHS).to_numpy() & measured)


def row_architectures(ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> np.ndarray:
    """The architecture of every row's `device` (None where the catalog has none)."""
    return ops["device"].map(lambda d: catalog[d].architecture if d in catalog else None).to_numpy(dtype=object)


def least_arithmetic(ops: pd.DataFrame, architectures: Sequence[str | None] | np.ndarray) -> np.ndarray:
    """Per row, the share of its counted FLOPs (`op_work`) the cheapest algorithm a library may run does: 1, or
    1 / `WINOGRAD_MAX_REDUCTION` on `winograd_rows`. A kernel's compute roofline is its FLOPs times this over the
    peak of its math."""
    return np.where(winograd_rows(ops, architectures), 1.0 / WINOGRAD_MAX_REDUCTION, 1.0)


def device_peaks(ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> tuple[np.ndarray, np.ndarray]:
    """(peak GFLOP/s of each row's math on its device, the device's memory bandwidth GB/s): the catalog entry with
    its gaps imputed (`perfmodel.hardware.impute`), the peak by `perfmodel.hardware.math.peak_gflops`."""
    devices = ops["device"]
    missing = sorted(set(devices) - set(catalog))
    if missing:
        raise PerfmodelError(f"device(s) {missing} are not in the hardware catalog given")
    specs = {device: imputed(catalog[device], catalog.values())[0] for device in set(devices)}
    gemm = ops["op_class"].isin(GEMM_CLASSES).to_numpy()
    keys = list(zip(devices, row_maths(ops), gemm))
    peaks = {key: peak_gflops(specs[key[0]], key[1], bool(key[2])) for key in set(keys)}
    return (np.array([peaks[key] for key in keys], dtype=np.float64),
            np.array([specs[d].memory_bandwidth_gb_s for d in devices], dtype=np.float64))


def op_roofline_ms(ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> np.ndarray:
    """max(FLOPs / peak, bytes / bandwidth) of every row on its `device`, ms (`core.cost.roofline_ms`)."""
    work = op_work(ops)
    peak, bandwidth = device_peaks(ops, catalog)
    out: np.ndarray = cost.roofline_ms(work.flops, work.bytes_read + work.bytes_written, peak, bandwidth)
    return out

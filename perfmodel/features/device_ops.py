"""Features of one op on one accelerator, from the op's shape and the accelerator's spec sheet only.

An op is a row of a DataFrame whose columns are the shape fields of an op measurement (`op_class`, `op_name`,
`dtype`, `batch`, `m`, `n`, `k`, `hidden`, conv fields) plus `device` (a catalog id). `op_work` gives its FLOPs and
bytes from a table of one function per op class. `device_op_features` adds the device's spec-sheet numbers and
dimensionless ratios that transfer between devices: arithmetic intensity over the device's ridge point, GEMM tiles
per compute unit (waves), working set over L2, and `rocm` (catalog vendor AMD: ROCm's kernels and launch path;
the fastest element-wise ops in its sweeps take 13-20 µs, on CUDA GPUs 25-55 µs). It never uses the device's
name, so a regressor trained on some GPUs answers for a GPU described only by its catalog entry.

GEMM shapes follow NeuSight's sweep files: `bmm` is B × (M×K · K×N); `linear` is a (B·M)×K input times an N×K
weight. A conv is 2-D, square (`input_size`, `kernel_size`), NCHW.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.core.errors import PerfmodelError
from perfmodel.hardware.impute import imputed
from perfmodel.hardware.math import on_tensor_cores, peak_gflops
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.profilers.external import OpClass

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}

# the op classes the cross-device regressors learn, and how a row of each describes its shape
GEMM_CLASSES = ("bmm", "linear", "conv2d")
VECTOR_CLASSES = ("elementwise", "softmax", "layernorm")
OP_CLASSES = GEMM_CLASSES + VECTOR_CLASSES
# NeuSight's OPName -> op class: one table for imports (perfmodel.importers.neusight) and for predictions from
# NeuSight-schema op tables (perfmodel.predictor.op_table)
NEUSIGHT_ELEMENTWISE_OPS = frozenset({"add", "addu", "mul", "mulu", "div", "divu", "pow", "powu", "relu", "gelu",
                                      "tanh"})
NEUSIGHT_OP_CLASS: Mapping[str, OpClass] = {"bmm": "bmm", "linear": "linear", "conv": "conv2d", "ln": "layernorm",
                                        "softmax": "softmax", **dict.fromkeys(NEUSIGHT_ELEMENTWISE_OPS, "elementwise")}

# element-wise ops by how many tensors of B·H elements they read, and FLOPs per element (NeuSight's op names;
# the `u` suffix is the tensor-with-scalar variant)
ELEMENTWISE_READS: dict[str, int] = {"add": 2, "mul": 2, "div": 2, "pow": 2, "sub": 2,
                                     "addu": 1, "mulu": 1, "divu": 1, "powu": 1, "relu": 1, "gelu": 1, "tanh": 1}
ELEMENTWISE_FLOPS: dict[str, float] = {"pow": 10.0, "powu": 10.0, "gelu": 14.0, "tanh": 10.0}
DEFAULT_ELEMENTWISE_READS = 1
DEFAULT_ELEMENTWISE_FLOPS = 1.0
SOFTMAX_FLOPS_PER_ELEMENT = 5.0
LAYERNORM_FLOPS_PER_ELEMENT = 8.0

# GEMM tile edge used to count waves (tiles / compute units); 128×128 is the common cuBLAS/rocBLAS fp32 tile
GEMM_TILE = 128

SHAPE_COLUMNS = ("batch", "m", "n", "k", "hidden", "in_channels", "out_channels", "kernel_size", "input_size",
                 "stride", "padding")

# device columns taken from the catalog entry (numbers only)
DEVICE_FEATURES = ("peak_gflops", "memory_bandwidth_gbps", "compute_units", "l2_cache_mb", "boost_clock_mhz",
                   "fp32_cores_per_cu", "memory_gb", "watts_per_core")

DEVICE_OP_FEATURES = (
    # shape, log2(1 + x)
    "log_batch", "log_m", "log_n", "log_k", "log_hidden",
    # work
    "log_flops", "log_bytes", "log_intensity",
    # device
    *DEVICE_FEATURES, "log_ridge",
    # op on device
    "intensity_over_ridge", "log_compute_ms", "log_memory_ms", "log_roofline_ms", "waves", "log_tiles",
    "wave_tail", "log_wave_compute_ms", "working_set_over_l2", "elements_per_core",
    # software stack: 1 on AMD (ROCm/HIP kernels and launch path), 0 elsewhere (CUDA)
    "rocm",
    # a GEMM or convolution on tensor/matrix cores (TF32, fp16, bf16, fp8 math): other tiles, other efficiency
    "tensor_math",
    # tensor-core rows: the row's peak FLOP/s per board watt (missing elsewhere). A part whose datasheet tensor peak
    # needs more power than its board has cannot hold that peak (large fp16 GEMMs reach 0.90-0.94 of it on an RTX
    # 3090/4090, whose fp32-accumulate tensor rate is capped at half, 0.63-0.73 on an L40S, A100, A40 or RTX PRO
    # 6000). On CUDA-core fp32 rows it did not transfer across GPUs held out (T4, P4), so it is left out there
    "log_peak_per_watt",
)
# the features that describe the device itself; a regressor that must answer for unseen devices can leave them
# out and rely on the ratios (roofline times, waves, intensity over ridge) alone
DEVICE_IDENTITY_FEATURES = (*DEVICE_FEATURES, "log_ridge")


@dataclass(frozen=True)
class OpWork:
    flops: np.ndarray
    bytes_read: np.ndarray
    bytes_written: np.ndarray
    gemm_m: np.ndarray  # the (M, N) of the output of the GEMM an op is (B folded into M); 0 for vector ops
    gemm_n: np.ndarray
    gemm_batch: np.ndarray


def _col(ops: pd.DataFrame, name: str) -> np.ndarray:
    if name not in ops:
        return np.zeros(len(ops))
    return pd.to_numeric(ops[name], errors="coerce").fillna(0).to_numpy(dtype=np.float64)


def _bmm(ops: pd.DataFrame, e: np.ndarray) -> OpWork:
    b, m, n, k = (np.maximum(_col(ops, c), 1) for c in ("batch", "m", "n", "k"))
    return OpWork(2 * b * m * n * k, e * b * (m * k + k * n), e * b * m * n, m, n, b)


def _linear(ops: pd.DataFrame, e: np.ndarray) -> OpWork:
    b, m, n, k = (np.maximum(_col(ops, c), 1) for c in ("batch", "m", "n", "k"))
    return OpWork(2 * b * m * n * k, e * (b * m * k + n * k), e * b * m * n, b * m, n, np.ones_like(b))


def conv_output_size(input_size: np.ndarray, kernel_size: np.ndarray, stride: np.ndarray,
                     padding: np.ndarray) -> np.ndarray:
    return np.maximum((input_size + 2 * padding - kernel_size) // np.maximum(stride, 1) + 1, 1)


def _conv2d(ops: pd.DataFrame, e: np.ndarray) -> OpWork:
    b = np.maximum(_col(ops, "batch"), 1)
    cin, cout = np.maximum(_col(ops, "in_channels"), 1), np.maximum(_col(ops, "out_channels"), 1)
    size, kernel = np.maximum(_col(ops, "input_size"), 1), np.maximum(_col(ops, "kernel_size"), 1)
    out = conv_output_size(size, kernel, np.maximum(_col(ops, "stride"), 1), _col(ops, "padding"))
    m, n, k = b * out * out, cout, cin * kernel * kernel  # implicit GEMM
    return OpWork(2 * m * n * k, e * (b * cin * size * size + cout * k), e * m * n, m, n, np.ones_like(b))


def _elements(ops: pd.DataFrame) -> np.ndarray:
    return np.maximum(_col(ops, "batch"), 1) * np.maximum(_col(ops, "hidden"), 1)


def _elementwise(ops: pd.DataFrame, e: np.ndarray) -> OpWork:
    numel = _elements(ops)
    names = ops["op_name"].astype(str) if "op_name" in ops else pd.Series([""] * len(ops))
    reads = names.map(lambda s: ELEMENTWISE_READS.get(s, DEFAULT_ELEMENTWISE_READS)).to_numpy(dtype=np.float64)
    flops = names.map(lambda s: ELEMENTWISE_FLOPS.get(s, DEFAULT_ELEMENTWISE_FLOPS)).to_numpy(dtype=np.float64)
    zero = np.zeros(len(ops))
    return OpWork(flops * numel, e * reads * numel, e * numel, zero, zero, zero)


def _row_op(flops_per_element: float, extra_reads_per_row: float) -> Callable[[pd.DataFrame, np.ndarray], OpWork]:
    def work(ops: pd.DataFrame, e: np.ndarray) -> OpWork:
        numel = _elements(ops)
        hidden = np.maximum(_col(ops, "hidden"), 1)
        zero = np.zeros(len(ops))
        return OpWork(flops_per_element * numel, e * (numel + extra_reads_per_row * hidden), e * numel, zero, zero,
                      zero)
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
                                                     "gemm_batch")}
    for op_class, work_of in OP_WORK.items():
        mask = (ops["op_class"] == op_class).to_numpy()
        if mask.any():
            work = work_of(ops[mask], e[mask])
            for name in fields:
                fields[name][mask] = getattr(work, name)
    return OpWork(**fields)


def row_maths(ops: pd.DataFrame) -> pd.Series:
    """The math of every row: its `math` column where given (a job's rows: `perfmodel.predictor.math_modes`), else
    its dtype (a measurement's: fp32 rows ran in fp32, half rows on tensor cores)."""
    dtypes = ops["dtype"] if "dtype" in ops else pd.Series(["fp32"] * len(ops), index=ops.index)
    if "math" not in ops:
        return dtypes
    return ops["math"].where(ops["math"].notna(), dtypes)


def _device_columns(devices: pd.Series, maths: pd.Series, gemm: np.ndarray,
                    catalog: Mapping[str, HardwareSpec]) -> pd.DataFrame:
    missing = sorted(set(devices) - set(catalog))
    if missing:
        raise PerfmodelError(f"device(s) {missing} are not in the hardware catalog given")
    table = {}
    keys = list(zip(devices, maths, gemm))
    specs = {device: imputed(catalog[device], catalog.values())[0] for device in set(devices)}
    for device, math, is_gemm in set(keys):
        spec = specs[device]
        table[(device, math, is_gemm)] = {
            "peak_gflops": peak_gflops(spec, math, bool(is_gemm)),
            "memory_bandwidth_gbps": spec.memory_bandwidth_gbps,
            "compute_units": float(spec.compute_units),
            "l2_cache_mb": spec.l2_cache_mb or np.nan,  # NaN only if no reference device has it
            "boost_clock_mhz": spec.boost_clock_mhz or np.nan,
            "fp32_cores_per_cu": spec.fp32_cores_per_cu or np.nan,
            "memory_gb": spec.memory_gb,
            # board power per fp32 core: low on 70-75 W inference cards (T4, P4, L4), which cannot hold their
            # boost clock under a long GEMM
            "watts_per_core": (spec.tdp_w / (spec.compute_units * spec.fp32_cores_per_cu)
                               if spec.tdp_w and spec.fp32_cores_per_cu else np.nan),
        }
    return pd.DataFrame([table[key] for key in keys], columns=list(DEVICE_FEATURES))


def _log2p(x: np.ndarray) -> np.ndarray:
    return np.log2(1 + np.maximum(x, 0))


def device_op_features(ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> pd.DataFrame:
    """The `DEVICE_OP_FEATURES` columns (in order) of every row; `catalog` maps each row's `device` to its spec."""
    dtypes = ops["dtype"] if "dtype" in ops else pd.Series(["fp32"] * len(ops), index=ops.index)
    work = op_work(ops)
    gemm = ops["op_class"].isin(GEMM_CLASSES).to_numpy()
    maths = row_maths(ops)
    device = _device_columns(ops["device"], maths, gemm, catalog)
    bytes_total = work.bytes_read + work.bytes_written
    peak = device["peak_gflops"].to_numpy() * 1e9
    bandwidth = device["memory_bandwidth_gbps"].to_numpy() * 1e9
    compute_ms = work.flops / peak * 1e3
    memory_ms = bytes_total / bandwidth * 1e3
    intensity = work.flops / np.maximum(bytes_total, 1)
    ridge = peak / bandwidth
    tiles = work.gemm_batch * np.ceil(work.gemm_m / GEMM_TILE) * np.ceil(work.gemm_n / GEMM_TILE)
    units = device["compute_units"].to_numpy()
    waves = tiles / units
    l2_bytes = device["l2_cache_mb"].to_numpy() * 1e6
    # compute time with whole waves: every wave costs a full tile's FLOPs on every compute unit
    tile_flops = np.where(tiles > 0, work.flops / np.maximum(tiles, 1), 0.0)
    wave_compute_ms = np.ceil(waves) * tile_flops / (peak / units) * 1e3
    cores = units * np.nan_to_num(device["fp32_cores_per_cu"].to_numpy(), nan=64.0)
    elements = work.bytes_written / dtype_bytes(dtypes)
    tensor = np.asarray([on_tensor_cores(catalog[d], m, bool(g)) for d, m, g in zip(ops["device"], maths, gemm)],
                        dtype=bool)
    tdp_w = {device: imputed(catalog[device], catalog.values())[0].tdp_w for device in set(ops["device"])}
    watts = np.array([tdp_w[d] or np.nan for d in ops["device"]], dtype=np.float64)
    out = {
        "log_batch": _log2p(_col(ops, "batch")),
        "log_m": _log2p(_col(ops, "m") + _col(ops, "in_channels")),
        "log_n": _log2p(_col(ops, "n") + _col(ops, "out_channels")),
        "log_k": _log2p(_col(ops, "k") + _col(ops, "input_size")),
        "log_hidden": _log2p(_col(ops, "hidden") + _col(ops, "kernel_size")),
        "log_flops": _log2p(work.flops),
        "log_bytes": _log2p(bytes_total),
        "log_intensity": np.log2(np.maximum(intensity, 1e-3)),
        **{name: device[name].to_numpy() for name in DEVICE_FEATURES},
        "log_ridge": np.log2(ridge),
        "intensity_over_ridge": intensity / ridge,
        "log_compute_ms": np.log2(np.maximum(compute_ms, 1e-9)),
        "log_memory_ms": np.log2(np.maximum(memory_ms, 1e-9)),
        "log_roofline_ms": np.log2(np.maximum(np.maximum(compute_ms, memory_ms), 1e-9)),
        "waves": waves,
        "log_tiles": _log2p(tiles),
        "wave_tail": np.where(tiles > 0, np.ceil(waves) - waves, 0.0),
        "log_wave_compute_ms": np.log2(np.maximum(np.maximum(wave_compute_ms, compute_ms), 1e-9)),
        "working_set_over_l2": bytes_total / l2_bytes,
        "elements_per_core": elements / cores,
        "rocm": np.asarray([float(catalog[d].vendor == "AMD") for d in ops["device"]]),
        "log_peak_per_watt": np.where(tensor, np.log2(peak / 1e9 / watts), np.nan),
        "tensor_math": tensor.astype(np.float64),
    }
    return pd.DataFrame(out, index=ops.index)[list(DEVICE_OP_FEATURES)]


def roofline_ms(ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> np.ndarray:
    """max(FLOPs / peak, bytes / bandwidth) of every row, in ms."""
    return np.exp2(device_op_features(ops, catalog)["log_roofline_ms"].to_numpy())

"""Features of one op on one accelerator, from the op's shape and the accelerator's spec sheet only.

An op is a kernel row (`perfmodel.lowering.ops`: `op_class`, `op_name`, `dtype`, `batch`, `m`, `n`, `k`, `hidden`,
conv fields) plus `device` (a catalog id); `perfmodel.lowering.ops.op_work` gives its FLOPs and bytes, and
`perfmodel.core.cost` its compute, memory and roofline times. `device_op_features` adds the device's spec-sheet
numbers and dimensionless ratios that transfer between devices: arithmetic intensity over the device's ridge point,
GEMM tiles per compute unit (waves), working set over L2, and `rocm` (catalog vendor AMD: ROCm's kernels and launch
path; the fastest element-wise ops in its sweeps take 13-20 µs, on CUDA GPUs 25-55 µs). It never uses the device's
name, so a regressor trained on some GPUs answers for a GPU described only by its catalog entry.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from perfmodel.core import cost
from perfmodel.core.errors import PerfmodelError
from perfmodel.core.units import GIGA
from perfmodel.hardware.impute import imputed
from perfmodel.hardware.math import on_tensor_cores, peak_gflops
from perfmodel.hardware.spec import HardwareSpec

# the row schema, its op classes and their work live in perfmodel.lowering.ops (below the profilers)
from perfmodel.lowering.ops import (
    GEMM_CLASSES,
    dtype_bytes,
    op_work,
    row_maths,
)

# GEMM tile edge used to count waves (tiles / compute units); 128×128 is the common cuBLAS/rocBLAS fp32 tile
GEMM_TILE = 128

# device columns taken from the catalog entry (numbers only)
DEVICE_FEATURES = ("peak_gflops", "memory_bandwidth_gb_s", "compute_units", "l2_cache_mb", "boost_clock_mhz",
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


def _col(ops: pd.DataFrame, name: str) -> np.ndarray:
    if name not in ops:
        return np.zeros(len(ops))
    return pd.to_numeric(ops[name], errors="coerce").fillna(0).to_numpy(dtype=np.float64)


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
            "memory_bandwidth_gb_s": spec.memory_bandwidth_gb_s,
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
    peak_gflops_ = device["peak_gflops"].to_numpy()
    bandwidth_gb_s = device["memory_bandwidth_gb_s"].to_numpy()
    peak = peak_gflops_ * GIGA
    compute_ms = cost.compute_ms(work.flops, peak_gflops_)
    memory_ms = cost.memory_ms(bytes_total, bandwidth_gb_s)
    intensity = cost.arithmetic_intensity(work.flops, bytes_total)
    ridge = cost.ridge_point(peak_gflops_, bandwidth_gb_s)
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
        "log_roofline_ms": np.log2(np.maximum(cost.maximum(compute_ms, memory_ms), 1e-9)),
        "waves": waves,
        "log_tiles": _log2p(tiles),
        "wave_tail": np.where(tiles > 0, np.ceil(waves) - waves, 0.0),
        "log_wave_compute_ms": np.log2(np.maximum(np.maximum(wave_compute_ms, compute_ms), 1e-9)),
        "working_set_over_l2": bytes_total / l2_bytes,
        "elements_per_core": elements / cores,
        "rocm": np.asarray([float(catalog[d].vendor == "AMD") for d in ops["device"]]),
        "log_peak_per_watt": np.where(tensor, np.log2(peak / GIGA / watts), np.nan),
        "tensor_math": tensor.astype(np.float64),
    }
    return pd.DataFrame(out, index=ops.index)[list(DEVICE_OP_FEATURES)]


__all__ = [
    "DEVICE_FEATURES", "DEVICE_IDENTITY_FEATURES", "DEVICE_OP_FEATURES", "GEMM_TILE", "device_op_features",
]

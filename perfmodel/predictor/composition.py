"""What a composed prediction is made of: named, device-independent features of the kernel sum, for the learned
whole-step stage (`perfmodel.regressors.whole_step`).

A composed step is Σ kernel rows (each priced by the per-op device model) + the host time the device cannot hide.
Kernel microbenchmarks run one op at a time under ideal conditions; a real training step differs from their sum in
ways that depend on what the step is made of (how much of it is tensor-core GEMMs, memory-bound passes, tiny
kernels the host issues faster than they run, ...). These features describe that mix, the job's graph and the
device's spec sheet, never the device's name, so the stage learned from some GPUs answers for others:

- `log_composed_ms`: log2 of the composed step (device time + exposed host time), ms;
- `share_<group>`: the share of device time in each math group (matmul, conv, autocast_fp32, vector) and in the
  optimizer step, and `share_tensor_math` (GEMM/conv rows on tensor cores);
- two shares of 2-D convolution time that no kernel measurement covers (`conv_math_masks`): `share_conv_tf32`,
  convolutions in TF32 math, and `share_conv_winograd`, 3 x 3 stride-1 convolutions in fp32 on the CUDA cores;
- `share_memory_bound`: the share of device time in rows whose memory time exceeds their compute time;
- `roofline_over_composed`: Σ row roofline / composed step (how close to the device's peaks the kernel model puts
  the step; a convolution's at the least arithmetic a library may run it with, `lowering.ops.least_arithmetic`),
  `host_over_device`: the host's issue time over the device time, `share_overhead`: exposed host time;
- `log_kernels`, `log_mean_kernel_us`: kernel count and mean kernel time;
- graph: `log_flops`, `log_bytes` (per sample and per step), `log_params`, `log_intensity`;
- device: `log_peak_tensor_tflops` (the peak of the math its GEMM time runs in), `log_bandwidth_gb_s`, `log_ridge`,
  `log_peak_per_watt`, `log_memory_gb`, `amp` (half-precision GEMMs) — ratios and magnitudes, no identity.

Beside them, not features of any stage (`SHARING_FEATURES`, for the co-location model,
`perfmodel.placement.colocation`): `sm_fill`, the share of the device's compute units the step's kernels hold while
they run (time-weighted over its kernels, `kernel_sm_fill`), and `bandwidth_share`, the share of the device's memory
bandwidth they draw while they run (their bytes at the peak bandwidth over their time): what CUDA MPS leaves to a
job sharing the GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.core import cost
from perfmodel.core.ir import Graph
from perfmodel.features.device_ops import GEMM_TILE
from perfmodel.hardware.math import on_tensor_cores, peak_gflops
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import JobSpec
from perfmodel.lowering.ops import GEMM_CLASSES, WINOGRAD_MATHS, OpWork, least_arithmetic, moved_bytes, op_work
from perfmodel.lowering.rows import conv_spatial_dims, winograd_shaped
from perfmodel.predictor.math_modes import CONV_KINDS, GROUPS, group_of, resolved_table

COMPOSITION_FEATURES: tuple[str, ...] = (
    "log_composed_ms",
    *(f"share_{g}" for g in GROUPS), "share_conv_amp", "share_conv_tf32", "share_conv_winograd",
    "share_optimizer", "share_tensor_math", "share_memory_bound",
    "roofline_over_composed", "host_over_device", "share_overhead",
    "log_kernels", "log_mean_kernel_us",
    "log_flops_per_sample", "log_bytes_per_sample", "log_flops", "log_params", "log_intensity",
    "log_peak_tensor_tflops", "log_bandwidth_gb_s", "log_ridge", "log_peak_per_watt", "log_memory_gb", "amp",
)
# what the composition says besides the stage's features: for the co-location model
SHARING_FEATURES: tuple[str, ...] = ("sm_fill", "bandwidth_share")

# How many of the device's compute units (SMs, CUs) a kernel holds while it runs, from its shape: a GEMM or
# convolution one output tile of `GEMM_TILE` x `GEMM_TILE` per compute unit (a tensor-core tile takes most of an
# SM's registers and shared memory; the implicit GEMM of a convolution likewise), an element-wise, softmax or norm
# kernel one thread per `ELEMENTS_PER_THREAD` output elements against the `RESIDENT_THREADS_PER_CU` threads a
# compute unit holds (2,048 on NVIDIA SMs since Kepler and on AMD CUs' 32 wavefronts of 64; 1,024-1,536 on Turing and
# the consumer Ampere and Ada parts). Assumptions from the libraries' launch shapes, not fits: no public measurement
# of concurrent kernels was at hand. Split-K GEMMs (a small output with a long reduction) hold more units than
# their tiles say; they count as their tiles.
ELEMENTS_PER_THREAD = 4  # PyTorch's vectorised element-wise kernels: 4 elements a thread
RESIDENT_THREADS_PER_CU = 2048


def kernel_sm_fill(work: OpWork, gemm: np.ndarray, units: float | np.ndarray) -> np.ndarray:
    """The share of the device's compute units each kernel row holds while it runs, in [1 / units, 1] (see
    `RESIDENT_THREADS_PER_CU`): rows of `work` (`op_work`), whether each is a GEMM, and the compute units of its
    device (one number, or one per row)."""
    units = np.asarray(units, dtype=np.float64)
    tiles = work.gemm_batch * np.ceil(work.gemm_m / GEMM_TILE) * np.ceil(work.gemm_n / GEMM_TILE)
    threads = work.elements_written / ELEMENTS_PER_THREAD
    fill = np.where(gemm, tiles / units, threads / (units * RESIDENT_THREADS_PER_CU))
    return np.clip(fill, 1.0 / units, 1.0)


def step_sm_fill(latency_ms: np.ndarray, fill: np.ndarray) -> np.ndarray:
    """The share of the compute units a step's kernels hold while the device runs them: each kernel's
    (`kernel_sm_fill`) weighted by its time, one value per step of `latency_ms` (steps, rows); 1 without kernels."""
    total = latency_ms.sum(axis=1)
    return np.where(total > 0, (latency_ms * fill).sum(axis=1) / np.maximum(total, 1e-300), 1.0)


def conv_amp_share(share_conv: Any, amp: Any) -> Any:
    """The share of device time in convolutions run in half precision (AMP): `share_conv` where the GEMM math is
    fp16/bf16 on units of its own (`amp` 1), else 0 (floats or columns)."""
    return share_conv * amp


# Two kinds of 2-D convolution run unlike any kernel the per-op model was trained on, so a whole step prices them off
# in a way the learned stage can only correct if it knows how much of the step they are:
# - TF32 math: no public kernel measurement is in TF32; the per-op model prices a TF32 convolution with the
#   tensor-core efficiency it learned from fp16 rows, at the TF32 peak. Real TF32 training steps of convolutional
#   networks run well below that (SSD300 and Mask R-CNN in NGC containers: 1.2-2.0x the composed step on A100s, A40s
#   and RTX A-series, whose TF32 peak is 2-8x their fp32 one; 0.9-1.2x on GeForce Ampere, where it equals it).
# - 3 x 3 stride-1 convolutions in fp32 on the CUDA cores (`lowering.rows.winograd_shaped`): with
#   `torch.backends.cudnn.benchmark` on (as NVIDIA's DeepLearningExamples, timm and most CNN training scripts set
#   it), cuDNN times its algorithms and can pick Winograd for these, which does 2.25-4x fewer multiplies than the
#   direct convolution; the per-op model learned from eager timings. The same two models' fp32 steps on Volta, Turing
#   and Pascal GPUs ran at 0.4-0.8x the composed step, some faster than the direct convolutions' FLOPs at the fp32
#   peak allow.
# Only 2-D convolutions count: the 1-D convolutions of audio models (WaveGlow, Tacotron 2) run other kernels, and
# counting them (WaveGlow's TF32 steps on A100s ran faster than composed) made models held out worse. That choice
# was made by looking at the held-out figures of `bench/real_runs.py`.
CONV_MATH_SHARES = ("share_conv_tf32", "share_conv_winograd")


def conv_math_masks(rows: pd.DataFrame, maths: np.ndarray, graph: Graph | None,
                    exclude: np.ndarray) -> dict[str, np.ndarray]:
    """{`share_conv_tf32`: the GEMM rows of 2-D convolutions in TF32 math, `share_conv_winograd`: those of
    Winograd-shaped ones in `WINOGRAD_MATHS`}: boolean masks over `rows` (none of the rows in `exclude`; none at all
    without the `graph` the rows came from)."""
    none = np.zeros(len(rows), dtype=bool)
    if graph is None or "node_id" not in rows or not len(rows):
        return dict.fromkeys(CONV_MATH_SHARES, none)
    convs = [node for node in graph.nodes if node.kind.value in CONV_KINDS]
    two_d = {node.id for node in convs if conv_spatial_dims(node) == 2}
    winograd = {node.id for node in convs if winograd_shaped(node)}  # a 3 x 3 kernel: 2-D
    gemm = rows["op_class"].isin(GEMM_CLASSES).to_numpy() & ~exclude
    nodes = rows["node_id"]
    return {"share_conv_tf32": gemm & nodes.isin(two_d).to_numpy() & (maths == "tf32"),
            "share_conv_winograd": gemm & nodes.isin(winograd).to_numpy() & np.isin(maths, list(WINOGRAD_MATHS))}


def with_derived_features(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with the composition features that derive from others filled in where a frame composed before they
    existed lacks them."""
    if "share_conv_amp" not in frame and {"share_conv", "amp"} <= set(frame):
        frame = frame.assign(share_conv_amp=conv_amp_share(frame["share_conv"], frame["amp"]))
    return frame


def _log2(x: Any) -> Any:
    return np.log2(np.maximum(np.asarray(x, dtype=np.float64), 1e-12))


def row_peaks(rows: pd.DataFrame, hardware: HardwareSpec) -> np.ndarray:
    """The peak GFLOP/s of every kernel row's math on `hardware`."""
    gemm = rows["op_class"].isin(GEMM_CLASSES).to_numpy()
    maths = rows["math"].to_numpy() if "math" in rows else np.full(len(rows), "fp32")
    peaks = {(m, g): peak_gflops(hardware, m, bool(g)) for m, g in set(zip(maths, gemm))}
    return np.array([peaks[(m, g)] for m, g in zip(maths, gemm)], dtype=np.float64)


def gemm_log_peak_tflops(compute_ms: np.ndarray, gemm: np.ndarray, peaks_gflops: np.ndarray,
                         default_gflops: float) -> np.ndarray:
    """log2 of the peak TFLOP/s of the math a step's GEMM work runs in: each GEMM row's peak weighted by its share
    of the GEMM FLOPs (geometrically; a row's FLOPs are its `compute_ms` at its peak), one value per step of
    `compute_ms` (steps, rows). A step whose GEMMs run in two maths gets a peak between them: under PyTorch's `fp32`
    defaults on Ampere and later, a ResNet's convolutions run in TF32 and its one small linear layer in FP32, and
    the step is a TF32 step; a BERT's matmuls run in FP32 and it is an FP32 step. FLOPs, not time: a small GEMM that
    takes as long in FP32 as in TF32 (bound by memory or launch) must not make the FP32 step look like one of a
    slower math, or the learned correction would answer it faster than its TF32 twin. A step without GEMM work gets
    `default_gflops` (its precision's matmul peak)."""
    work = compute_ms[:, gemm] * peaks_gflops[gemm]
    total = work.sum(axis=1)
    weighted = (work * _log2(peaks_gflops[gemm] / 1e3)).sum(axis=1) / np.maximum(total, 1e-300)
    return np.where(total > 0, weighted, _log2(default_gflops / 1e3))


def composition_features(spec: JobSpec, graph: Graph, hardware: HardwareSpec, rows: pd.DataFrame,
                         latency_ms: np.ndarray, breakdown_ms: Mapping[str, float],
                         host_ms_per_kernel: float) -> dict[str, float]:
    """The `COMPOSITION_FEATURES` of one composed step (`rows` and their predicted `latency_ms`, and the step's
    `breakdown_ms`: forward, backward, optimizer, communication, overhead)."""
    work = op_work(rows)
    compute = cost.compute_ms(work.flops, row_peaks(rows, hardware))
    memory = cost.memory_ms(moved_bytes(rows, work), hardware.memory_bandwidth_gb_s)
    fill = kernel_sm_fill(work, rows["op_class"].isin(GEMM_CLASSES).to_numpy(), hardware.compute_units)
    totals = graph.totals
    flops = float(totals.flops_fwd + totals.flops_bwd)
    bytes_ = float(totals.bytes_read_fwd + totals.bytes_written_fwd + totals.bytes_read_bwd
                   + totals.bytes_written_bwd)
    arrays = composition_feature_arrays(
        spec, hardware, rows, np.asarray(latency_ms, dtype=np.float64)[None, :], compute[None, :], memory[None, :],
        {name: np.array([value]) for name, value in breakdown_ms.items()}, np.array([flops]), np.array([bytes_]),
        totals.params, np.array([spec.batch_size]), host_ms_per_kernel, fill[None, :], graph)
    return {name: float(value[0]) for name, value in arrays.items()}


def composition_feature_arrays(spec: JobSpec, hardware: HardwareSpec, rows: pd.DataFrame, latency_ms: np.ndarray,
                               compute_ms: np.ndarray, memory_ms: np.ndarray,
                               breakdown_ms: Mapping[str, np.ndarray], flops: np.ndarray, bytes_: np.ndarray,
                               params: int, batch: np.ndarray, host_ms_per_kernel: float,
                               sm_fill: np.ndarray | None = None, graph: Graph | None = None
                               ) -> dict[str, np.ndarray]:
    """`composition_features` of one job's step at several batches at once: `rows` are the kernels (the same at
    every batch), `latency_ms`, `compute_ms` and `memory_ms` (batches, rows), the breakdown, the graph's FLOPs
    and bytes (fwd + bwd) and `batch` one value per batch; with the `SHARING_FEATURES` where each row's
    `kernel_sm_fill` is given (batches, rows; else every kernel holds the whole device), and the convolution math
    shares where the `graph` the rows came from is (`conv_math_masks`; else 0)."""
    ms = latency_ms
    device_ms = np.maximum(ms.sum(axis=1), 1e-9)
    composed_ms = np.maximum(sum(breakdown_ms.values()), 1e-9)
    groups = rows["kind"].map(group_of).to_numpy() if "kind" in rows else np.full(len(rows), "vector")
    optimizer = (rows["phase"] == "optimizer").to_numpy() if "phase" in rows else np.zeros(len(rows), bool)
    gemm = rows["op_class"].isin(GEMM_CLASSES).to_numpy()
    maths = rows["math"].to_numpy() if "math" in rows else np.full(len(rows), "fp32")
    tensor = np.array([on_tensor_cores(hardware, m, bool(g)) for m, g in zip(maths, gemm)], dtype=bool)
    table = resolved_table(spec.precision, hardware)
    gemm_math = table["matmul"].math
    # half-precision GEMMs on tensor / matrix cores: where the spec sheet gives no faster peak for the half math (a
    # GTX 1080 Ti's fp16, a V100's bf16), the libraries run it at the fp32 rate and the step is not an AMP step. Nor
    # is it where the half math is packed vector math (a P100's or a Vega's fp16, twice the fp32 rate, no tensor
    # cores): every AMP run the whole-step stage learned from ran on tensor cores, so such a step is to the stage the
    # fp32 step it otherwise is, its peak the fp32 one (its kernels are still priced at the fp16 rate)
    vector_half = gemm_math in ("fp16", "bf16") and not on_tensor_cores(hardware, gemm_math)
    half = float(gemm_math in ("fp16", "bf16") and not vector_half
                 and peak_gflops(hardware, gemm_math, True) > peak_gflops(hardware, "fp32", True))
    log_peak = gemm_log_peak_tflops(np.asarray(compute_ms, dtype=np.float64), gemm, row_peaks(rows, hardware),
                                    peak_gflops(hardware, gemm_math, True))
    if vector_half:
        log_peak = np.full(len(ms), _log2(peak_gflops(hardware, "fp32", True) / 1e3))
    batch = np.maximum(batch, 1)
    watts = hardware.tdp_w or float("nan")
    arch = hardware.architecture
    n = len(ms)

    def share(mask: np.ndarray) -> np.ndarray:
        return ms[:, mask].sum(axis=1) / device_ms

    def same(value: float) -> np.ndarray:
        return np.full(n, value, dtype=np.float64)

    conv = share((groups == "conv") & ~optimizer)
    out = {
        "log_composed_ms": _log2(composed_ms),
        **{f"share_{g}": share((groups == g) & ~optimizer) for g in GROUPS},
        "share_conv_amp": conv_amp_share(conv, half),
        **{name: share(mask) for name, mask in conv_math_masks(rows, maths, graph, optimizer).items()},
        "share_optimizer": share(optimizer),
        "share_tensor_math": share(tensor),
        "share_memory_bound": (ms * (memory_ms > compute_ms)).sum(axis=1) / device_ms,
        # the floor: each kernel's compute for the least arithmetic a library may run it with (Winograd's)
        "roofline_over_composed": (np.maximum(compute_ms * least_arithmetic(rows, np.full(len(rows), arch)),
                                              memory_ms).sum(axis=1) / composed_ms),
        "host_over_device": rows.shape[0] * host_ms_per_kernel / device_ms,
        "share_overhead": np.asarray(breakdown_ms.get("overhead", same(0.0))) / composed_ms,
        "log_kernels": same(_log2(len(rows) + 1)),
        "log_mean_kernel_us": _log2(device_ms * 1e3 / max(len(rows), 1)),
        "log_flops_per_sample": _log2(flops / batch + 1),
        "log_bytes_per_sample": _log2(bytes_ / batch + 1),
        "log_flops": _log2(flops + 1),
        "log_params": same(_log2(params + 1)),
        "log_intensity": _log2(flops / np.maximum(bytes_, 1.0)),
        "log_peak_tensor_tflops": log_peak,
        "log_bandwidth_gb_s": same(_log2(hardware.memory_bandwidth_gb_s)),
        "log_ridge": log_peak + _log2(1e3 * cost.ridge_point(1.0, hardware.memory_bandwidth_gb_s)),
        "log_peak_per_watt": log_peak + _log2(1e3 / watts) if watts == watts else same(float("nan")),
        "log_memory_gb": same(_log2(hardware.memory_gb)),
        "amp": same(half),
        "sm_fill": step_sm_fill(ms, sm_fill) if sm_fill is not None else same(1.0),
        # a kernel draws at most the device's bandwidth: its bytes at the peak over its time, never above 1
        "bandwidth_share": np.minimum(memory_ms, ms).sum(axis=1) / device_ms,
    }
    return {name: np.asarray(out[name], dtype=np.float64) for name in (*COMPOSITION_FEATURES, *SHARING_FEATURES)}

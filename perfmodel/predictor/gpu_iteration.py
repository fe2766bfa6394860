"""Iteration time of a job on a catalog accelerator nobody profiled, from the per-op device model.

The job's graph is mapped to kernel rows (`graph_op_rows`: forward, and for training each node's backward GEMMs
and element-wise kernels); each row gets the storage dtype and the math its precision runs on that device
(`perfmodel.predictor.math_modes`: `fp32` runs cuDNN convolutions in TF32 on Ampere and later, `amp` runs GEMMs in
fp16 and softmax / layer norm in fp32, ...); the promoted `xgb-device-ops` model predicts every row from the
device's spec sheet, bounded below by the roofline of its math; and the iteration is the explicit sum

    forward (Σ forward rows) + backward (Σ backward rows) + optimizer + communication (0 on one device) + overhead

where overhead is the host's dispatch time the device could not hide (`host_bound_ms`: eager PyTorch issues one
kernel every `HOST_MS_PER_KERNEL`; a fast GPU running small kernels waits for the host).

Rows the graph does not show but the framework runs:
- the optimizer step: PyTorch's default (foreach) implementations make `FOREACH_TENSOR_PASSES` passes over the
  parameters (AdamW: lerp, mul, addcmul, sqrt, div, add, addcdiv, and the weight-decay mul: 20 tensor reads and
  writes per element), a fused one (`fused_optimizer`) `FUSED_TENSOR_PASSES` (each tensor read or written once),
  in the weights' dtype, predicted as element-wise `add` kernels (each reads 2 tensors and writes 1);
- under autocast, every GEMM/conv weight cast to half in forward (read 4 B, write 2 B per element) and its gradient
  cast back to fp32 in backward, and for `amp` (fp16) the GradScaler's unscale and inf check over the gradients
  (`AMP_SCALER_PASSES`); for a half model with fp32 master weights, the copies of the gradients to fp32 and of the
  weights back to half (`MASTER_COPY_PASSES`), or, where the gradients accumulate in fp32 (`bf16-master`), each
  half gradient's addition into its fp32 buffer and the copy back (`FP32_GRADIENT_PASSES`);
- around each half-precision convolution on tensor / matrix cores, the library's (cuDNN's, MIOpen's) NCHW <-> NHWC
  transposes of its activations (`layout_transpose_rows`; none for a job that says `channels_last`).
And one the graph shows but the GPU runs otherwise: a fused `scaled_dot_product_attention`, where PyTorch has a
fused kernel for the GPU (`fuses_attention`), is one GEMM row per phase whose scores stay on chip (`on_chip_scale`),
not the eager decomposition.
The device-side launch gap is inside each op's predicted time (the model's floor). The floor is mostly NeuSight's
(its fp32 ops timed one eager call at a time: 25-65 us for a kernel of a few us), and taking it out of a training
step's eager rows was tried (each row's price less, in quadrature, that of the smallest kernel of its class on the
device, `floor_twins`, plus 3 us, never below its roofline; the whole-step stage refitted): Lambda's one-GPU runs held
out by model family 20.9 -> 20.5 % MAPE (Tacotron 2 22 -> 18 %), held out by chip unchanged (18.9 %); Gavel's 2019
runs, which the stage does not correct, P100 23 -> 32 % and K80 62 -> 68 %, all faster: on those hosts the floor
stands in for the per-op host cost `HOST_MS_PER_KERNEL` does not reach. Subtracting it whole was worse on both (Lambda
20.9 -> 22.6 %). Kept as is.

On a CPU whose catalog entry has a rate of new memory (`HardwareSpec.first_touch_gb_s`, timed by `hw bench`), each
new tensor of `FRESH_MAP_BYTES` or more that the step makes is charged its bytes at that rate on top of its row
(`fresh_tensor_ms`): glibc maps a block that large afresh on every allocation and PyTorch keeps no CPU memory cache,
so its pages are faulted in every step, which the op sweep's shapes (up to 32 MiB) never show. Those tensors are a
forward or backward row's output that large, an embedding's weight gradient (`embedding_gradient_bytes`) and the
default Adam step's temporaries of each parameter that large (`optimizer_fresh_bytes`). A GPU's caching allocator
reuses its memory: no charge there.

Physically possible by construction: no row faster than its roofline (`ROOFLINE_BOUNDED`, in the regressor), no
convolution slower than im2col + its GEMM (`IM2COL_PASSES`), and no node whose backward does at least its forward's
FLOPs has a backward faster than its forward (`backward_at_least_forward`).

The interval sums the rows' p10 and p90: the comonotone bound, since errors of one model on one device are
correlated. `extrapolated` is set when a row is (its math or the device's peak or bandwidth lies outside the
training data: TF32 always, since no public TF32 measurement exists) or the graph assumes something (balanced
routing of a mixture of experts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfmodel.core import cost
from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph, Node
from perfmodel.core.opkinds import OpKind
from perfmodel.core.units import samples_per_s
from perfmodel.features.whole_graph import OPTIMIZER_TENSOR_PASSES
from perfmodel.hardware.impute import imputed
from perfmodel.hardware.math import has_tensor_cores, on_tensor_cores
from perfmodel.hardware.spec import FRESH_MAP_BYTES, HardwareSpec
from perfmodel.jobs.spec import JobSpec, Precision
from perfmodel.lowering.ops import fused_rows
from perfmodel.lowering.rows import BACKWARD, EAGER, FORWARD, depthwise, graph_op_rows, memory_row
from perfmodel.predictor.math_modes import (
    CONV_KINDS,
    MATMUL_KINDS,
    group_of,
    maths_by_group,
    resolved_table,
    row_maths,
)
from perfmodel.predictor.memory import estimate_memory
from perfmodel.predictor.predict import Prediction

if TYPE_CHECKING:
    from perfmodel.predictor.batch_sweep import Sweep
    from perfmodel.regressors.device_ops import OpLatencyModel, OpPrediction

# row op classes as a user reads them: the per-op model prices every normalization (batch, group, layer, RMS) as
# its `layernorm` class
SHOWN_CLASS = {"layernorm": "normalization"}
OPTIMIZER = "optimizer"
# tensor passes (reads + writes per parameter element) of PyTorch's default foreach optimizer steps:
# SGD momentum: mul_ + add_ on the buffer, add_ on the params (2 + 3 + 3); Adam: lerp_ (3), mul_ (2), addcmul_ (3),
# sqrt (2), div_ (2), add_ eps (2), addcdiv_ on the params (4); AdamW adds the decoupled weight decay mul_ (2)
FOREACH_TENSOR_PASSES = {"sgd": 8, "adam": 18, "adamw": 20}
# a fused step (`JobSpec.fused_optimizer`: torch's fused=True, apex's, DeepSpeed's, Megatron-LM's) makes the fewest
# passes a step can, the roofline's: each tensor read once and the updated ones written once, the weight decay
# inside the kernel (`features.whole_graph.OPTIMIZER_TENSOR_PASSES`: SGD momentum 5, Adam and AdamW 7)
FUSED_TENSOR_PASSES = OPTIMIZER_TENSOR_PASSES
AMP_SCALER_PASSES = 2  # GradScaler.unscale_: read and write every gradient (the inf check rides along)
# fp16-master / bf16-master: half gradients -> fp32 (read 2 B, write 4 B: 1.5 fp32 passes; apex unscales and checks
# for inf in that copy) and fp32 weights -> the half model (1.5)
MASTER_COPY_PASSES = 3
# bf16-master (`Precision.fp32_gradients`): each half gradient added into its fp32 buffer as backward produces it
# (read 2 B, read and write 4 B: 2.5 fp32 passes) and the fp32 weights copied back to the half model (1.5)
FP32_GRADIENT_PASSES = 4
# new tensors a default (not fused) optimizer step allocates per parameter: Adam's and AdamW's `sqrt` and `div` of
# the second moment (torch's single-tensor step, a CPU's: its foreach step is for GPUs); SGD updates in place. On a
# CPU, those of a parameter of `FRESH_MAP_BYTES` or more fault their pages in every step (`fresh_tensor_ms`)
FRESH_OPTIMIZER_TEMPORARIES = {"sgd": 0, "adam": 2, "adamw": 2}
PASSES_PER_ADD_KERNEL = 3  # an `add` row reads 2 tensors and writes 1
ROW_HIDDEN = 4096  # width of the rows standing for passes over parameters
GEMM_KINDS = MATMUL_KINDS | CONV_KINDS
# host time to issue one kernel from eager PyTorch (Python, the dispatcher, autograd, the launch): see
# `host_bound_ms`. An assumption, not a fit: PyTorch's eager overhead is ~5-10 us per op on a server CPU, and no
# public measurement here pins it (vTrain's Megatron runs, `bench/whole_model.py --fit-host`, score the same from
# 0 to 30 us: their small-micro-batch cost is additive, not a host-bound stream)
HOST_MS_PER_KERNEL = 0.008
# In a training step, a kernel in a half type (autocast's, or a model cast to half) is never priced faster than the
# same kernel in fp32 by more than their rooflines differ: t_half >= t_fp32 x roofline_half / roofline_fp32 (half
# the bytes, the half math's peak). The per-op model's training rows of each type come from different sources:
# fp32 mostly from NeuSight, whose eager timings carry a 25-65 us floor per op (what an eager training op costs,
# whatever its precision), half types from serving traces timed at 1-8 us; without the bound a small half kernel
# looked up to 10x faster than its fp32 twin. Checked where nothing was fitted: DeepBench's fp16 recurrent layers
# on a V100 (`bench/rnn_layers.py`: measured 1.7x faster than fp32 at the median, priced 5.4x without the bound and
# 2.4x with it). An inference step has no autograd and keeps the per-op price (tensor-parallel prefill on A100s,
# `bench/splitwise.py --max-shapes 6`: 15.5 % MAPE without the bound, 16.4 % with it).
HALF_TYPES = frozenset({"fp16", "bf16", "fp8"})
# What the bound may add to a half kernel's own price: at most the per-op floor the fp32 timings carry (NeuSight's
# 25-65 us), the part of the two sources' disagreement it is there for. A large kernel's price stays its own: its
# fp32 twin is compute, and where the fp32 peak is high next to the fp16 tensor rate (a half to a quarter of it on
# GA10x and Ada, which count dual-issue fp32 lanes) the roofline ratio held every large fp16 GEMM to the efficiency
# the fp32 model gives an fp32 GEMM, about half of what tensor cores reach (Transformer-XL's AMP steps on RTX 30/40
# and A-series cards were composed at 1.3-2x their measured time).
HALF_LIFT_MAX_MS = 0.065
# cuDNN's tensor-core convolution kernels for half types read and write channels-last (NHWC) tensors; given
# PyTorch's default channels-first (NCHW) tensors, each convolution call transposes its activation input and output
# around the kernel (NVIDIA's cuDNN developer guide, "Tensor Transformations": NCHW-to-NHWC; the `nchwToNhwcKernel`
# and `nhwcToNchwKernel` of a profiled AMP step; what `channels_last` saves). Per convolution and training step:
# forward x in, y out; backward data dy in, dx out; backward weights x and dy in. AMD's MIOpen does the same on
# matrix cores: its xdlops implicit-GEMM solvers (assembly and Composable Kernel) are NHWC kernels that serve an NCHW
# problem by transposing into NHWC buffers and back (MIOpen's "xdlops NCHW support by transpose", 2021; ROCm's
# rocm-libraries, "Add NHWC Layout Support for Winograd Convolution Solvers", 2026, on PyTorch's NCHW calls). TF32
# and fp32 convolutions have kernels that read NCHW directly and are not transposed; neither are a CPU's, those of a
# GPU without tensor / matrix cores, nor depthwise convolutions (`rows.depthwise`: PyTorch runs them in its own
# channels-first kernel, or cuDNN's depthwise path for large fp16 ones; no tensor-core GEMM).
LAYOUT_TRANSPOSE_MATHS = frozenset({"fp16", "bf16"})
LAYOUT_TRANSPOSES = {FORWARD: ("x", "y"), BACKWARD: ("y", "x", "x", "y")}
# GPUs where PyTorch runs `scaled_dot_product_attention` as one fused kernel (`fuses_attention`), by architecture:
# its memory-efficient kernel needs compute capability 5.0 or later and its flash kernel 8.0 or later (ATen's
# `sdp_utils.cpp`, `check_mem_efficient_hardware_support`: sm50 to sm121); on ROCm both come from AOTriton, built
# for CDNA 2 (MI200), CDNA 3 (MI300) and CDNA 4 (MI350). Elsewhere (Kepler, GCN, CDNA 1's MI100, RDNA 1-2) it falls
# back to the math decomposition. A sheet naming no known architecture: fused if it has tensor / matrix cores.
FUSED_ATTENTION_ARCHITECTURES = frozenset({"maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper",
                                           "blackwell", "cdna2", "cdna3", "cdna4"})
MATH_ATTENTION_ARCHITECTURES = frozenset({"kepler", "gcn", "gcn5", "cdna", "rdna", "rdna2"})
# A convolution is never priced slower than the same convolution run as im2col + one GEMM (cuDNN's GEMM algorithm,
# always among those it picks from): the GEMM row (M = batch x output pixels, N = output channels, K = input
# channels x kernel area) priced by the per-op model, plus writing and reading the im2col matrix (M x K) at the
# device's bandwidth. The conv model's training sweeps hold no feature map below 5 x 5; on 1-4 pixel maps (a
# CIFAR-sized ResNet's last stages) it priced a 512 -> 512 3 x 3 convolution at batch 64 on a V100 at 3.5 ms on a 1 x 1
# map against 0.6 ms on a 2 x 2 one with four times the work (a smaller input slower than a larger one). Not where
# the device's own kernel of the row was measured (`OpLatencyModel.measured_kernels`: a depthwise convolution's
# gradients, which `hw bench` times as themselves): the bound is a library's choice of algorithm, and oneDNN runs a
# depthwise convolution's gradients in kernels of their own, no GEMM among its choices (a 5 x 5 depthwise weight
# gradient over 4 x 240 x 28 x 28 took 46 ms on a 2-core EPYC, several times its GEMM twin's bound).
IM2COL_PASSES = 2  # the im2col matrix written once, read once by the GEMM
_EMPTY = pd.DataFrame(columns=["op_class", "op_name", "dtype", "math", "batch", "hidden", "phase", "part", "kind",
                               "launch"])


def fused_bytes_share(optimizer: str) -> float:
    """What a fused step moves of the bytes torch's default step (foreach, or per tensor: the same passes) moves:
    the ratio of their passes (`FUSED_TENSOR_PASSES` / `FOREACH_TENSOR_PASSES`; AdamW 0.35)."""
    return FUSED_TENSOR_PASSES[optimizer] / FOREACH_TENSOR_PASSES[optimizer]


def optimizer_rows(params: int, optimizer: str | None, dtype: str = "fp32", extra_passes: int = 0,
                   fused: bool = False) -> pd.DataFrame:
    """The optimizer step as element-wise `add` rows over the parameters (none for inference): the passes of
    torch's default (foreach) step, or of a `fused` one, and `extra_passes` (copies, the scaler's)."""
    if not optimizer or params <= 0:
        return _EMPTY.copy()
    passes = (FUSED_TENSOR_PASSES if fused else FOREACH_TENSOR_PASSES)[optimizer]
    kernels = math.ceil((passes + extra_passes) / PASSES_PER_ADD_KERNEL)
    return pd.DataFrame({"op_class": "elementwise", "op_name": "add", "dtype": dtype, "math": dtype,
                         "batch": [max(math.ceil(params / ROW_HIDDEN), 1)] * kernels, "hidden": ROW_HIDDEN,
                         "phase": OPTIMIZER, "part": "step", "kind": "optimizer", "launch": EAGER})


def _copy_record(read_elements: float, written_elements: float, dtype: str, phase: str, part: str,
                 **extra: Any) -> dict[str, Any]:
    """One memory-bound copy kernel as a job row (`memory_row`) in `dtype`, of kind `copy`."""
    row = memory_row(read_elements, written_elements, ROW_HIDDEN, part)
    return {"op_class": row.op_class, "op_name": row.op_name, "dtype": dtype, "math": dtype, "phase": phase,
            "part": row.part, "kind": "copy", "launch": row.launch, **extra, **row.shape}


def optimizer_fresh_bytes(graph: Graph, spec: JobSpec) -> float:
    """Bytes of the new tensors of `FRESH_MAP_BYTES` or more that one optimizer step allocates: the temporaries
    (`FRESH_OPTIMIZER_TEMPORARIES`) of each parameter that large, in the weights' dtype (0 for inference and for
    a fused step, which updates in place). A parameter two nodes share (tied embeddings) counts once per node: its
    two gradients are summed into a new tensor as large."""
    temporaries = FRESH_OPTIMIZER_TEMPORARIES[spec.optimizer.value]
    if spec.mode.value != "train" or spec.fused_optimizer or not temporaries:
        return 0.0
    return float(temporaries * sum(_large_params_bytes(graph, spec)))


def _large_params_bytes(graph: Graph, spec: JobSpec, kind: OpKind | None = None) -> list[int]:
    """Bytes of each node's parameters (of nodes of `kind`, if given) that reach `FRESH_MAP_BYTES`, in the weights'
    dtype (a half model's own, else fp32)."""
    precision = spec.precision
    element = 2 if precision.half_state and precision.half_dtype else 4
    return [node.params * element for node in graph.nodes
            if (kind is None or node.kind == kind) and node.params * element >= FRESH_MAP_BYTES]


def embedding_gradient_bytes(graph: Graph, spec: JobSpec) -> float:
    """Bytes of the weight gradients of `FRESH_MAP_BYTES` or more that a training step's embeddings make: each a new
    tensor, zeroed, then scattered into. Their rows are memory rows of equal bytes, which read as much as they write
    (`lowering.rows.memory_row`), so their written bytes say half of it."""
    if spec.mode.value != "train":
        return 0.0
    return float(sum(_large_params_bytes(graph, spec, OpKind.embedding)))


def fresh_tensor_ms(bytes_written: np.ndarray, rows: pd.DataFrame, hardware: HardwareSpec, graph: Graph,
                    spec: JobSpec) -> np.ndarray:
    """Per row of `rows` (the last axis of `bytes_written`, the rows' written bytes), what the new tensors of
    `FRESH_MAP_BYTES` or more it makes cost beyond its kernel on `hardware`, at the rate the host faults their pages
    in (`first_touch_gb_s`): a forward or backward row's output that large (but an embedding's), the optimizer's
    temporaries (`optimizer_fresh_bytes`, spread over its rows) and the embeddings' weight gradients
    (`embedding_gradient_bytes`, over the backward rows). Zeros on a device without that rate: a GPU (its caching
    allocator reuses memory), or a CPU whose new pages cost nothing measurable."""
    written = np.asarray(bytes_written, dtype=np.float64)
    rate = hardware.first_touch_gb_s
    if rate is None:
        return np.zeros_like(written)
    phase = rows["phase"].to_numpy()
    optimizer, backward = phase == OPTIMIZER, phase == BACKWARD
    own = ~optimizer & (rows["kind"].to_numpy() != OpKind.embedding.value)
    fresh = np.where(own & (written >= FRESH_MAP_BYTES), written, 0.0)
    spread = ((optimizer, optimizer_fresh_bytes(graph, spec)), (backward, embedding_gradient_bytes(graph, spec)))
    for mask, total in spread:
        if mask.any() and total:
            fresh = fresh + np.where(mask, total / mask.sum(), 0.0)
    return cost.memory_ms(fresh, rate)


def weight_cast_rows(graph: Graph, precision: Precision, training: bool) -> pd.DataFrame:
    """Autocast's casts of each GEMM/conv weight: fp32 -> half once per forward (read 4 B, write 2 B an element:
    a half-precision kernel reading 2 and writing 1 elements) and, in training, the half gradient -> fp32 in
    backward. One kernel per weight, as autocast launches them."""
    if not precision.autocast:
        return _EMPTY.copy()
    half = precision.half_dtype or "fp16"
    records = []
    for phase in (FORWARD, BACKWARD) if training else (FORWARD,):
        for node in graph.nodes:
            if node.kind.value in GEMM_KINDS and node.params > 0:
                records.append(_copy_record(2 * node.params, node.params, half, phase, "weight_cast"))
    return pd.DataFrame.from_records(records) if records else _EMPTY.copy()


def transposes_layout(hardware: HardwareSpec, conv_math: str) -> bool:
    """The GPU's convolution library (cuDNN, MIOpen) transposes the NCHW tensors around a convolution of
    `conv_math` on `hardware`: a half type (`LAYOUT_TRANSPOSE_MATHS`) on a GPU's tensor / matrix cores (a CPU's
    matrix units, AMX, run oneDNN's own layouts)."""
    return (hardware.kind == "gpu" and conv_math in LAYOUT_TRANSPOSE_MATHS
            and on_tensor_cores(hardware, conv_math))


def fuses_attention(hardware: HardwareSpec) -> bool:
    """PyTorch runs a fused SDPA on `hardware` as one fused kernel (`FUSED_ATTENTION_ARCHITECTURES`): a GPU only
    (a CPU's per-op prices are its own)."""
    if hardware.kind != "gpu":
        return False
    architecture = (hardware.architecture or "").lower()
    if architecture in FUSED_ATTENTION_ARCHITECTURES | MATH_ATTENTION_ARCHITECTURES:
        return architecture in FUSED_ATTENTION_ARCHITECTURES
    return has_tensor_cores(hardware)


def on_chip_scale(rows: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> np.ndarray:
    """Per row, 1, except for a GEMM of a fused kernel (`fused_rows`): its compute roofline over its roofline. The
    per-op model prices it as the eager GEMM of its shape, which writes or reads the scores through memory; in the
    fused kernel they stay on chip, so it keeps the eager GEMM's efficiency against its roofline, on its compute
    roofline alone (never faster than the peak of its math). `priced` keeps the kernel's launch floor under it."""
    from perfmodel.lowering.ops import device_peaks, op_work

    out = np.ones(len(rows))
    fused = fused_rows(rows)
    if not fused.any():
        return out
    own = rows[fused]
    work = op_work(own)
    peak, bandwidth = device_peaks(own, catalog)
    roofline = cost.roofline_ms(work.flops, work.bytes_read + work.bytes_written, peak, bandwidth)
    out[fused] = cost.compute_ms(work.flops, peak) / np.maximum(roofline, 1e-12)
    return out


def floor_twins(rows: pd.DataFrame) -> pd.DataFrame:
    """Each row as the smallest kernel of its class, dtype, math and device (every shape column at 1, or 0 where the
    row has none): what the per-op model charges a kernel of that class for being launched at all."""
    from perfmodel.lowering.ops import SHAPE_COLUMNS

    return rows.assign(**{f: (rows[f] > 0).astype(np.int64) for f in SHAPE_COLUMNS if f in rows})


def layout_transpose_rows(graph: Graph, hardware: HardwareSpec, conv_math: str, training: bool) -> pd.DataFrame:
    """The NCHW <-> NHWC transposes the library runs around each convolution where it `transposes_layout`: one
    memory-bound kernel per tensor per call, reading and writing it in that half type, in the phases of
    `LAYOUT_TRANSPOSES` (forward only for inference). None elsewhere."""
    if not transposes_layout(hardware, conv_math):
        return _EMPTY.copy()
    records = []
    for phase in (FORWARD, BACKWARD) if training else (FORWARD,):
        for node in graph.nodes:
            if node.kind.value not in CONV_KINDS or cuda_core_conv(node) or not node.input_tensors \
                    or not node.output_tensors:
                continue
            numel = {"x": node.input_tensors[0].numel, "y": node.output_tensors[0].numel}
            records += [_copy_record(numel[tensor], numel[tensor], conv_math, phase, "layout_transpose",
                                     node_id=node.id) for tensor in LAYOUT_TRANSPOSES[phase]]
    return pd.DataFrame.from_records(records) if records else _EMPTY.copy()


def job_rows(spec: JobSpec, graph: Graph, hardware: HardwareSpec) -> pd.DataFrame:
    """Every kernel of one iteration of `spec` on `hardware`, with its storage dtype and math (a channels-last job's
    convolutions without layout transposes)."""
    precision = spec.precision
    training = spec.mode.value == "train"
    rows = graph_op_rows(graph, dtype="fp32", mode=spec.mode.value, fused_attention=fuses_attention(hardware))
    table = resolved_table(precision, hardware)
    groups = rows["kind"].map(group_of)
    rows["dtype"] = groups.map({g: e.dtype for g, e in table.items()})
    rows["math"] = row_maths(rows["kind"], cuda_core_conv_rows(rows, graph), table)
    # the optimizer steps fp32 weights but a half model's own (fp16, bf16); a master-weight step also copies the half
    # gradients into fp32 ones and the fp32 weights back into the model
    weights = (precision.half_dtype or "fp32") if precision.half_state else "fp32"
    extra_passes = (AMP_SCALER_PASSES if precision == Precision.amp
                    else FP32_GRADIENT_PASSES if precision.fp32_gradients
                    else MASTER_COPY_PASSES if precision.master_weights else 0)
    optimizer = spec.optimizer.value if training else None
    casts = weight_cast_rows(graph, precision, training)
    transposes = (_EMPTY.copy() if spec.channels_last
                  else layout_transpose_rows(graph, hardware, table[group_of("conv")].math, training))
    parts = [casts[casts["phase"] == FORWARD], rows[rows["phase"] == FORWARD],
             transposes[transposes["phase"] == FORWARD], rows[rows["phase"] == BACKWARD],
             transposes[transposes["phase"] == BACKWARD], casts[casts["phase"] == BACKWARD],
             optimizer_rows(graph.totals.params, optimizer, weights, extra_passes, spec.fused_optimizer)]
    return pd.concat([part for part in parts if len(part)], ignore_index=True)  # in launch order


def cuda_core_conv(node: Node) -> bool:
    """A convolution that runs on the CUDA cores whatever the precision (`math_modes.CUDA_CORE_CONV_MATH`): a
    dilated one (`Node.dilation` > 1) or a depthwise one (`rows.depthwise`). No layout transposes around it."""
    return node.dilation > 1 or depthwise(node)


def cuda_core_conv_rows(rows: pd.DataFrame, graph: Graph) -> np.ndarray:
    """Which rows are a CUDA-core convolution's (`cuda_core_conv`): their math is `CUDA_CORE_CONV_MATH`."""
    ids = {node.id for node in graph.nodes if cuda_core_conv(node)}
    if not ids or "node_id" not in rows:
        return np.zeros(len(rows), dtype=bool)
    return rows["node_id"].isin(ids).to_numpy()


def half_rows(rows: pd.DataFrame) -> np.ndarray:
    """Rows stored or computed in a half (or narrower) type (`HALF_TYPES`)."""
    maths = rows["math"].where(rows["math"].notna(), rows["dtype"]) if "math" in rows else rows["dtype"]
    return (rows["dtype"].isin(HALF_TYPES) | maths.isin(HALF_TYPES)).to_numpy()


def priced_with_fp32_twins(regressor: OpLatencyModel, rows: pd.DataFrame, catalog: Mapping[str, HardwareSpec],
                           training: np.ndarray) -> OpPrediction:
    """The per-op model's prediction of `rows`, every half row of a training step (`training`) raised to at least its
    fp32 twin's price times the ratio of their rooflines (see `HALF_TYPES`), by at most `HALF_LIFT_MAX_MS`. The rows
    and their twins are priced in one call of the model (its per-call cost paid once)."""
    from perfmodel.lowering.ops import op_roofline_ms

    half = training & half_rows(rows) if len(rows) else np.zeros(0, dtype=bool)
    if not half.any():
        return regressor.predict(rows, catalog)
    n, own = len(rows), rows[half]
    twins = own.assign(dtype="fp32", math="fp32")
    both = regressor.predict(pd.concat([rows, twins], ignore_index=True), catalog)
    roofline = op_roofline_ms(pd.concat([own, twins], ignore_index=True), catalog)
    floor = both.latency_ms[n:] * roofline[:len(own)] / roofline[len(own):]
    lift = np.ones(n)
    own_ms = both.latency_ms[:n][half]
    lift[half] = np.maximum(np.minimum(floor, own_ms + HALF_LIFT_MAX_MS) / own_ms, 1.0)
    return type(both)(both.latency_ms[:n] * lift, both.p10_ms[:n] * lift, both.p90_ms[:n] * lift,
                      both.extrapolated[:n])


def conv_gemm_twins(rows: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame, np.ndarray, np.ndarray]:
    """(which rows are convolutions, their GEMM twins as linear rows, the im2col matrix's bytes of each twin, each
    convolution's own bytes read and written): the implicit GEMM of each convolution row (`lowering.ops.op_work`'s
    M, N and K = FLOPs / 2MN) in the row's dtype and math."""
    from perfmodel.lowering.ops import dtype_bytes, op_work

    conv = (rows["op_class"] == "conv2d").to_numpy() if len(rows) else np.zeros(0, dtype=bool)
    own = rows[conv]
    if not conv.any():
        return conv, own, np.zeros(0), np.zeros(0)
    work = op_work(own)
    m, n = work.gemm_m, work.gemm_n
    k = work.flops / (2 * m * n)
    twins = own.assign(op_class="linear", op_name="linear", kind="linear", batch=1, m=m, n=n, k=k,
                       in_channels=0.0, out_channels=0.0, kernel_size=0.0, input_size=0.0, stride=0.0, padding=0.0)
    return (conv, twins, IM2COL_PASSES * m * k * dtype_bytes(own["dtype"]),
            np.asarray(work.bytes_read + work.bytes_written, dtype=np.float64))


def priced(regressor: OpLatencyModel, rows: pd.DataFrame, catalog: Mapping[str, HardwareSpec],
           training: np.ndarray) -> OpPrediction:
    """`priced_with_fp32_twins` of `rows`, every convolution row bounded above by its GEMM twin plus the im2col
    passes (see `IM2COL_PASSES`), the twins priced in the same call, and never below the convolution's own memory
    time: a strided 1 x 1 convolution's im2col matrix is smaller than the map it reads, so its twin alone could
    price it past the bandwidth. A fused kernel's GEMMs on their compute roofline (`on_chip_scale`), never below
    the price of the smallest kernel of their class on the device (`floor_twins`), priced in the same call."""
    fused = fused_rows(rows)
    if not fused.any():
        return _priced_convs(regressor, rows, catalog, training)
    n = len(rows)
    both = _priced_convs(regressor, pd.concat([rows, floor_twins(rows[fused])], ignore_index=True), catalog,
                         np.concatenate([training, training[fused]]))
    scale = on_chip_scale(rows, catalog)
    latency = both.latency_ms[:n]
    scale[fused] = np.maximum(scale[fused], np.minimum(both.latency_ms[n:] / latency[fused], 1.0))
    return type(both)(latency * scale, both.p10_ms[:n] * scale, both.p90_ms[:n] * scale, both.extrapolated[:n])


def _priced_convs(regressor: OpLatencyModel, rows: pd.DataFrame, catalog: Mapping[str, HardwareSpec],
                  training: np.ndarray) -> OpPrediction:
    conv, twins, im2col_bytes, conv_bytes = conv_gemm_twins(rows)
    if not conv.any():
        return priced_with_fp32_twins(regressor, rows, catalog, training)
    n = len(rows)
    both = priced_with_fp32_twins(regressor, pd.concat([rows, twins], ignore_index=True), catalog,
                                  np.concatenate([training, training[conv]]))
    bandwidth = twins["device"].map(lambda name: catalog[name].memory_bandwidth_gb_s).to_numpy(dtype=np.float64)
    bound = np.maximum(both.latency_ms[n:] + im2col_bytes / (bandwidth * 1e6), conv_bytes / (bandwidth * 1e6))
    bound[regressor.measured_kernels(rows[conv])] = np.inf
    scale = np.ones(n)
    scale[conv] = np.minimum(bound / both.latency_ms[:n][conv], 1.0)
    return type(both)(both.latency_ms[:n] * scale, both.p10_ms[:n] * scale, both.p90_ms[:n] * scale,
                      both.extrapolated[:n])


def host_bound_ms(gpu_ms: np.ndarray, host_ms_per_kernel: float) -> float:
    """When the last of `gpu_ms` kernels ends, if the host issues one kernel every `host_ms_per_kernel` (eager
    PyTorch: Python, the dispatcher, autograd and the launch, per op) and the device runs them in order as soon as
    both it and the kernel are ready: max over j of (the time kernel j is issued + the device time of kernels j..n).
    Never less than the device time alone, nor than the host time of all kernels."""
    return float(host_bound_steps(np.asarray(gpu_ms, dtype=np.float64)[None, :], host_ms_per_kernel)[0])


def host_bound_steps(gpu_ms: np.ndarray, host_ms_per_kernel: float) -> np.ndarray:
    """`host_bound_ms` of several steps at once: `gpu_ms` is (steps, kernels)."""
    if gpu_ms.shape[1] == 0:
        return np.zeros(len(gpu_ms))
    issued = host_ms_per_kernel * np.arange(1, gpu_ms.shape[1] + 1)
    remaining = np.cumsum(gpu_ms[:, ::-1], axis=1)[:, ::-1]
    return np.maximum((issued + remaining).max(axis=1), gpu_ms.sum(axis=1))


def heavy_nodes(flops_fwd: np.ndarray, flops_bwd: np.ndarray) -> np.ndarray:
    """Nodes whose backward does at least their forward's FLOPs (FLOPs per node, any leading axes)."""
    return (flops_fwd > 0) & (flops_bwd >= flops_fwd)


def row_nodes(rows: pd.DataFrame, graph: Graph) -> np.ndarray:
    """The position in `graph.nodes` of each row's node (-1: a row of no node, the optimizer's and the casts')."""
    position = {node.id: i for i, node in enumerate(graph.nodes)}
    ids = rows["node_id"] if "node_id" in rows else pd.Series([None] * len(rows))
    return np.array([position.get(i, -1) if isinstance(i, str) else -1 for i in ids], dtype=np.intp)


def backward_factors(nodes: np.ndarray, phase: np.ndarray, ms: np.ndarray, heavy: np.ndarray) -> np.ndarray:
    """The factor (steps, rows) that raises each node's backward to its forward time where the node is `heavy`
    (steps, graph nodes): an op's gradient is never computed faster than the op itself. `nodes` and `phase` are
    the rows' (`row_nodes`), `ms` their times (steps, rows)."""
    steps, width = heavy.shape
    out = np.ones(ms.shape)
    has = nodes >= 0
    forward, backward = has & (phase == FORWARD), has & (phase == BACKWARD)
    if not forward.any() or not backward.any():
        return out
    offsets = (np.arange(steps) * width)[:, None]

    def per_node(mask: np.ndarray) -> np.ndarray:
        flat = (offsets + nodes[mask][None, :]).ravel()
        return np.bincount(flat, weights=ms[:, mask].ravel(), minlength=steps * width).reshape(steps, width)

    fwd, bwd = per_node(forward), per_node(backward)
    raise_ = heavy & (bwd > 0) & (bwd < fwd)
    factor = np.where(raise_, fwd / np.where(bwd > 0, bwd, 1.0), 1.0)
    out[:, backward] = factor[:, nodes[backward]]
    return out


def backward_at_least_forward(rows: pd.DataFrame, ms: np.ndarray, graph: Graph) -> np.ndarray:
    """The factor (per row) that raises each node's backward to its forward time where the node's backward does at
    least its forward's FLOPs: an op's gradient is never computed faster than the op itself."""
    heavy = heavy_nodes(np.array([n.flops_fwd for n in graph.nodes]), np.array([n.flops_bwd for n in graph.nodes]))
    return backward_factors(row_nodes(rows, graph), rows["phase"].to_numpy(), np.asarray(ms)[None, :],
                            heavy[None, :])[0]


def _shared(jobs: Sequence[tuple[JobSpec, HardwareSpec]]) -> bool:
    """Whether two of the (job, device) share a graph on one device (a job and its float32 twins: the same kernels
    but the GEMMs), so that pricing each distinct kernel once saves work."""
    keys = [(spec.graph_key(), hardware.name) for spec, hardware in jobs]
    return len(set(keys)) < len(keys)


class DevicePredictor:
    """The promoted per-op device model (registry role `device-ops`) and the hardware catalog."""

    def __init__(self, regressor: OpLatencyModel, model_version: str, catalog: Mapping[str, HardwareSpec],
                 host_ms_per_kernel: float = HOST_MS_PER_KERNEL):
        self.regressor = regressor
        self.model_version = model_version
        self.catalog = catalog
        self.host_ms_per_kernel = host_ms_per_kernel

    @classmethod
    def load(cls, ref: str | None = None, models_dir: Any = None) -> DevicePredictor:
        from perfmodel.hardware.catalog import load_catalog
        from perfmodel.registry.registry import ModelRegistry
        from perfmodel.regressors import load_regressor
        from perfmodel.regressors.adaptation import adapted

        entry = ModelRegistry(models_dir).get(ref, role="device-ops")
        catalog = load_catalog()  # devices with their own measurements use their saved adaptation
        return cls(adapted(load_regressor(entry.path), catalog), entry.ref, catalog)

    def predict_rows(self, spec: JobSpec, hardware: HardwareSpec, graph: Graph,
                     rows: pd.DataFrame | None = None) -> tuple[pd.DataFrame, Any]:
        """The job's kernel rows on `hardware` and the regressor's prediction of each, made physically possible
        (rows bounded by their roofline in the regressor; backward raised to forward node by node). `rows`:
        `job_rows(spec, graph, hardware)` computed once for devices with the same math."""
        rows = (job_rows(spec, graph, hardware) if rows is None else rows).assign(device=hardware.name)
        out = self._priced(rows, np.full(len(rows), spec.mode.value == "train"))
        return rows, self._finished(spec, hardware, graph, rows, out)

    @staticmethod
    def _finished(spec: JobSpec, hardware: HardwareSpec, graph: Graph, rows: pd.DataFrame, out: Any) -> Any:
        """The regressor's prices of a job's rows, each backward raised to its forward node by node, plus what the
        new large tensors each row makes cost on a CPU (`fresh_tensor_ms`)."""
        from perfmodel.lowering.ops import op_work

        factor = backward_at_least_forward(rows, out.latency_ms, graph)
        fresh = (fresh_tensor_ms(op_work(rows).bytes_written, rows, hardware, graph, spec)
                 if hardware.first_touch_gb_s is not None else 0.0)  # the rows' work only where it is charged
        return type(out)(out.latency_ms * factor + fresh, out.p10_ms * factor + fresh, out.p90_ms * factor + fresh,
                         out.extrapolated)

    def _priced_once(self, rows: pd.DataFrame, training: np.ndarray) -> OpPrediction:
        """`_priced` of `rows`, each distinct (row, training) priced once: the rows of a float32 job and of its
        faster twins (`math_modes.FASTER_FLOAT32`) share every kernel but the GEMMs whose math differs (`_shared`)."""
        keys = np.column_stack([pd.util.hash_pandas_object(rows, index=False).to_numpy(), training.astype(np.uint64)])
        _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        if len(first) == len(rows):
            return self._priced(rows, training)
        out = self._priced(rows.iloc[first].reset_index(drop=True), training[first])
        return type(out)(out.latency_ms[inverse], out.p10_ms[inverse], out.p90_ms[inverse], out.extrapolated[inverse])

    def _priced(self, rows: pd.DataFrame, training: np.ndarray) -> OpPrediction:
        """The per-op model's prediction of `rows`, half rows of training steps bounded by their fp32 twins and
        convolutions by their GEMM twins (`priced`)."""
        return priced(self.regressor, rows, self.catalog, training)

    def predict(self, spec: JobSpec, accelerator: str, *, graph: Any = None) -> Prediction:
        return self.predict_composed(spec, accelerator, graph=graph)[0]

    def predict_composed(self, spec: JobSpec, accelerator: str, *, graph: Any = None,
                         phases: tuple[str, ...] = (FORWARD, BACKWARD, OPTIMIZER)
                         ) -> tuple[Prediction, dict[str, float]]:
        """The composed step (Σ kernel rows + exposed host time) and what it is made of
        (`perfmodel.predictor.composition.COMPOSITION_FEATURES`), for the learned whole-step stage. `phases`: the
        phases the step counts (forward and backward alone for measurements without the optimizer)."""
        from perfmodel.graph import graph_for_job
        from perfmodel.hardware.catalog import get_accelerator

        hardware = get_accelerator(accelerator, self.catalog)
        if hardware.name not in self.catalog:
            raise PerfmodelError(f"accelerator {hardware.name!r} is not in this predictor's catalog")
        graph = graph if graph is not None else graph_for_job(spec)
        rows, out = self.predict_rows(spec, hardware, graph)
        return self._composed(spec, hardware, graph, rows, out, phases)

    def predict_composed_many(self, items: Sequence[tuple[JobSpec, str, Graph]]
                              ) -> list[tuple[Prediction, dict[str, float]]]:
        """`predict_composed` of many (spec, accelerator, graph) at once: one call of the per-op model over all
        their kernel rows (its per-call cost, paid once), the same answers as one call each."""
        from perfmodel.hardware.catalog import get_accelerator

        hardware = [get_accelerator(accelerator, self.catalog) for _, accelerator, _ in items]
        for hw in hardware:
            if hw.name not in self.catalog:
                raise PerfmodelError(f"accelerator {hw.name!r} is not in this predictor's catalog")
        frames = [job_rows(spec, graph, hw).assign(device=hw.name) for (spec, _, graph), hw in zip(items, hardware)]
        if not frames:
            return []
        training = np.concatenate([np.full(len(rows), spec.mode.value == "train")
                                   for (spec, _, _), rows in zip(items, frames)])
        shared = _shared([(spec, hw) for (spec, _, _), hw in zip(items, hardware)])
        out = (self._priced_once if shared else self._priced)(pd.concat(frames, ignore_index=True), training)
        results = []
        start = 0
        for (spec, _, graph), hw, rows in zip(items, hardware, frames):
            part = slice(start, start + len(rows))
            start += len(rows)
            mine = self._finished(spec, hw, graph, rows, type(out)(
                out.latency_ms[part], out.p10_ms[part], out.p90_ms[part], out.extrapolated[part]))
            results.append(self._composed(spec, hw, graph, rows, mine, (FORWARD, BACKWARD, OPTIMIZER)))
        return results

    def predict_composed_sweeps(self, sweeps: Sequence[Sweep]) -> list[list[tuple[Prediction, dict[str, float]]]]:
        """`predict_composed` of each job of each sweep at each of its batches (`batch_sweep.Sweep`): the distinct
        kernels of them all priced in one call of the per-op model, each step composed with the same arithmetic,
        vectorised over the batches. Equal to composing the graph made at each batch, up to the rounding of shapes
        on the line (`bench/sweep.py --check`)."""
        from perfmodel.hardware.catalog import get_accelerator
        from perfmodel.lowering.ops import GEMM_CLASSES, moved_bytes, op_work
        from perfmodel.predictor.composition import kernel_sm_fill, row_peaks

        hardware = [get_accelerator(s.accelerator, self.catalog) for s in sweeps]
        for hw in hardware:
            if hw.name not in self.catalog:
                raise PerfmodelError(f"accelerator {hw.name!r} is not in this predictor's catalog")
        frames = [s.rows.kernels_at(s.batches, hw.name) for s, hw in zip(sweeps, hardware)]
        if not frames:
            return []
        frame = pd.concat(frames, ignore_index=True)
        priced = self._priced_once if _shared([(s.specs[0], hw) for s, hw in zip(sweeps, hardware)]) else self._priced
        out = priced(frame, np.concatenate([np.full(len(kernels), s.specs[0].mode.value == "train")
                                            for s, kernels in zip(sweeps, frames)]))
        work = op_work(frame)
        moved = moved_bytes(frame, work)
        fill = kernel_sm_fill(work, frame["op_class"].isin(GEMM_CLASSES).to_numpy(),
                              np.repeat([float(hw.compute_units) for hw in hardware], [len(k) for k in frames]))
        results, start = [], 0
        for s, hw, kernels in zip(sweeps, hardware, frames):
            part = slice(start, start + len(kernels))
            start += len(kernels)
            steps = len(s.specs)

            def per_row(values: np.ndarray, steps: int = steps, codes: np.ndarray = s.rows.codes) -> np.ndarray:
                return np.asarray(values).reshape(steps, -1)[:, codes]  # (batches, kernels) -> (batches, rows)

            peaks = np.tile(row_peaks(s.rows.kernels, hw), steps)
            compute = per_row(cost.compute_ms(work.flops[part], peaks))
            memory = per_row(cost.memory_ms(moved[part], hw.memory_bandwidth_gb_s))
            ms = per_row(out.latency_ms[part])
            factor = backward_factors(s.rows.nodes, s.rows.rows["phase"].to_numpy(), ms, s.graphs.heavy(s.batches))
            fresh = fresh_tensor_ms(per_row(work.bytes_written[part]), s.rows.rows, hw, s.graphs.first, s.specs[0])
            results.append(self._composed_steps(s, hw, ms * factor + fresh, per_row(out.p10_ms[part]) * factor + fresh,
                                                per_row(out.p90_ms[part]) * factor + fresh,
                                                per_row(out.extrapolated[part]), compute, memory,
                                                per_row(fill[part])))
        return results

    def _composed_steps(self, sweep: Sweep, hardware: HardwareSpec, ms: np.ndarray, p10: np.ndarray,
                        p90: np.ndarray, extrapolated: np.ndarray, compute_ms: np.ndarray, memory_ms: np.ndarray,
                        sm_fill: np.ndarray) -> list[tuple[Prediction, dict[str, float]]]:
        """`_composed` of one sweep's steps: row times (batches, rows) of `sweep.rows.rows` at `sweep.batches`, and
        each row's `composition.kernel_sm_fill` (batches, rows)."""
        from perfmodel.predictor.composition import composition_feature_arrays

        rows, batches, first = sweep.rows.rows, sweep.batches, sweep.specs[0]
        phase = rows["phase"].to_numpy()
        breakdown = {name: ms[:, phase == name].sum(axis=1) for name in (FORWARD, BACKWARD, OPTIMIZER)}
        breakdown["communication"] = np.zeros(len(batches))
        iter_time_ms = host_bound_steps(ms, self.host_ms_per_kernel)
        breakdown["overhead"] = iter_time_ms - ms.sum(axis=1)
        low, high = host_bound_steps(p10, self.host_ms_per_kernel), host_bound_steps(p90, self.host_ms_per_kernel)
        flops, bytes_ = sweep.graphs.flops_and_bytes(batches)
        features = composition_feature_arrays(first, self._featured(hardware), rows, ms, compute_ms, memory_ms,
                                              breakdown, flops, bytes_, sweep.graphs.params, batches,
                                              self.host_ms_per_kernel, sm_fill, sweep.graphs.first)
        reasons: dict[bytes, tuple[str, ...]] = {}
        maths = maths_by_group(first.precision, hardware)
        host_issue_ms = {name: float((phase == name).sum()) * self.host_ms_per_kernel
                         for name in (FORWARD, BACKWARD, OPTIMIZER)}
        out = []
        for i, spec in enumerate(sweep.specs):
            outside = extrapolated[i].astype(bool)
            why = reasons.get(outside.tobytes())
            if why is None:
                why = reasons[outside.tobytes()] = self._reasons(rows, outside, hardware, sweep.graphs.first)
            memory = estimate_memory(spec, sweep.graphs.graph_bytes(spec.precision, spec.batch_size))
            step = Prediction(
                job_name=spec.name, job_id=spec.key(), accelerator=hardware.name, model_version=self.model_version,
                iter_time_ms=float(iter_time_ms[i]),
                throughput_samples_per_s=samples_per_s(spec.batch_size, float(iter_time_ms[i])),
                interval_ms=(float(low[i]), float(high[i])),
                breakdown_ms={name: float(value[i]) for name, value in breakdown.items()},
                peak_memory_bytes=memory.peak_bytes, extrapolated=bool(why), extrapolation_reasons=why,
                math_by_op_group=maths, host_issue_ms=host_issue_ms)
            out.append((step, {name: float(value[i]) for name, value in features.items()}))
        return out

    def _featured(self, hardware: HardwareSpec) -> HardwareSpec:
        """`hardware` with the spec-sheet fields it lacks filled as the per-op model's features fill them
        (`impute.imputed`), so that the whole-step stage sees a GH200's board power as its die's other SKUs give it,
        not the average GPU's."""
        return imputed(hardware, self.catalog.values())[0]

    def _composed(self, spec: JobSpec, hardware: HardwareSpec, graph: Graph, rows: pd.DataFrame, out: Any,
                  phases: tuple[str, ...]) -> tuple[Prediction, dict[str, float]]:
        """The composed step of predicted kernel rows, and its composition features."""
        from perfmodel.predictor.composition import composition_features

        breakdown = self.breakdown(rows, out.latency_ms, phases)
        keep = rows["phase"].isin(phases).to_numpy()
        features = composition_features(spec, graph, self._featured(hardware), rows[keep], out.latency_ms[keep],
                                        breakdown, self.host_ms_per_kernel)
        iter_time_ms = sum(breakdown.values())
        reasons = self._reasons(rows, out.extrapolated, hardware, graph)
        return Prediction(
            job_name=spec.name, job_id=spec.key(), accelerator=hardware.name, model_version=self.model_version,
            iter_time_ms=iter_time_ms, throughput_samples_per_s=samples_per_s(spec.batch_size, iter_time_ms),
            interval_ms=(self.step_ms(rows, out.p10_ms, phases), self.step_ms(rows, out.p90_ms, phases)),
            breakdown_ms=breakdown,
            peak_memory_bytes=estimate_memory(spec, graph).peak_bytes,
            extrapolated=bool(reasons), extrapolation_reasons=reasons,
            math_by_op_group=maths_by_group(spec.precision, hardware),
            host_issue_ms={name: float((rows["phase"] == name).sum()) * self.host_ms_per_kernel
                           for name in (FORWARD, BACKWARD, OPTIMIZER)},
        ), features

    def breakdown(self, rows: pd.DataFrame, latency_ms: np.ndarray,
                  phases: tuple[str, ...] = (FORWARD, BACKWARD, OPTIMIZER)) -> dict[str, float]:
        """forward, backward, optimizer (device time of their rows), communication (0) and overhead: the host's
        dispatch time the device could not hide behind its kernels (`host_bound_ms`), over the rows of `phases`
        in launch order."""
        phase = rows["phase"].to_numpy()
        keep = np.isin(phase, phases)
        ms = np.asarray(latency_ms, dtype=np.float64)
        out = {name: float(ms[keep & (phase == name)].sum()) for name in (FORWARD, BACKWARD, OPTIMIZER)}
        out["communication"] = 0.0
        out["overhead"] = host_bound_ms(ms[keep], self.host_ms_per_kernel) - float(ms[keep].sum())
        return out

    def step_ms(self, rows: pd.DataFrame, latency_ms: np.ndarray,
                phases: tuple[str, ...] = (FORWARD, BACKWARD, OPTIMIZER)) -> float:
        """The iteration of these row latencies: their sum plus the host time they cannot hide."""
        return sum(self.breakdown(rows, latency_ms, phases).values())

    def _reasons(self, rows: pd.DataFrame, extrapolated: np.ndarray, hardware: HardwareSpec,
                 graph: Graph) -> tuple[str, ...]:
        from perfmodel.hardware.custom import custom_reasons

        reasons = custom_reasons(hardware)
        if extrapolated.any():
            outside = rows.loc[extrapolated]
            classes = ", ".join(sorted({SHOWN_CLASS.get(c, c) for c in outside["op_class"]}))
            reasons.append(f"{int(extrapolated.sum())} of the step's {len(rows)} kernels ({classes}) lie outside the "
                           f"model's training devices or maths on {hardware.name}")
        _, filled = imputed(hardware, self.catalog.values())
        if filled:
            reasons.append(f"{hardware.name} gives no " + "; no ".join(f"{field} ({how})"
                                                                        for field, how in sorted(filled.items())))
        if (rows["math"] == "tf32").any():
            reasons.append("TF32 is priced from tensor-core measurements of other dtypes and the spec sheet's TF32 "
                           "peak: no public TF32 measurement exists")
        maths = set(rows["math"])
        unsupported = [math for math, peak in (("fp16", hardware.peak_fp16_gflops), ("bf16", hardware.peak_bf16_gflops))
                       if math in maths and not peak]
        if unsupported:
            reasons.append(f"{' and '.join(unsupported)} on {hardware.name}, whose spec sheet gives no peak for it "
                           f"(no such units): priced at the fp32 peak, as the libraries emulate it")
        moe = getattr(graph, "moe", None)
        if moe is not None:
            reasons.append(f"mixture of experts: balanced top-{moe.top_k} routing over {moe.experts} experts assumed")
        return tuple(reasons)

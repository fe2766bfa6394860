"""What math each kernel of a job runs, by the job's precision and the device: one table.

A kernel row (`perfmodel.predictor.device_ops.graph_op_rows`) has a *storage* dtype (the bytes its tensors take:
`dtype`) and a *math* (the units and peak it runs at: `math`). They differ for TF32, where fp32 tensors are
multiplied on tensor cores at the TF32 peak. Rows are grouped by the IR kind of the node they come from:

| precision | matmul (linear, matmul, bmm, attention, rnn) | conv | autocast-fp32 kinds (softmax, layer norm, loss) | the rest (element-wise, norms, copies, ...) |
|---|---|---|---|---|
| fp32-strict | fp32 | fp32 | fp32 | fp32 |
| fp32 | fp32 | fp32 tensors, TF32 math* | fp32 | fp32 |
| tf32 | fp32 tensors, TF32 math* | fp32 tensors, TF32 math* | fp32 | fp32 |
| amp | fp16 | fp16 | fp32 | fp16 |
| amp-bf16 | bf16 | bf16 | fp32 | bf16 |
| fp16, fp16-master | fp16 | fp16 | fp16 | fp16 |
| bf16, bf16-master | bf16 | bf16 | bf16 | bf16 |

(*) where the device has TF32 (NVIDIA Ampere and later: the catalog's `peak_tf32_gflops`), else fp32. PyTorch's
defaults are why `fp32` differs from `fp32-strict`: `torch.backends.cudnn.allow_tf32` is True and
`torch.backends.cuda.matmul.allow_tf32` is False. Under autocast, softmax, layer norm and the losses run in fp32
(autocast's fp32 list); batch norm takes and returns half tensors (cuDNN computes its statistics in fp32), and the
element-wise ops between half-precision GEMMs see half tensors.

Two kinds of convolution run on the CUDA cores whatever the precision (`CUDA_CORE_CONV_MATH`; their storage dtype
stays the group's): a dilated one (`Node.dilation` > 1): cuDNN added dilation (v6) on its implicit-GEMM and
"algo 0" kernels only, and cuDNN 7 has no tensor-core algorithm for it; and a depthwise one
(`perfmodel.lowering.rows.depthwise`): PyTorch runs it in its own channels-first depthwise kernel (fp32
accumulation on the CUDA cores), or for large fp16 ones cuDNN's depthwise path (`ConvParams::use_cudnn_depthwise`),
not a tensor-core GEMM: no TF32, no tensor-core half math.
On A100s the dilated rule overshoots (cuDNN 8 runs some dilated shapes on tensor cores: docs/predictors.md, "A
dilated convolution"); priced there as TF32 GEMMs of their shape, Lambda's A100 WaveGlow steps would be composed
2.0-2.6x too fast instead of 1.1-1.5x too slow, so the rule stays until kernel timings of dilated convolutions say
more.

The peak each math reaches on a device is `perfmodel.hardware.math.peak_gflops`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.core.ir import GraphTotals
from perfmodel.hardware.math import has_tf32
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import Precision

# IR kinds by how autocast and the TF32 switches treat them
MATMUL_KINDS = frozenset({"linear", "matmul", "bmm", "attention", "rnn"})
CONV_KINDS = frozenset({"conv"})
AUTOCAST_FP32_KINDS = frozenset({"softmax", "layernorm", "loss"})
GROUPS = ("matmul", "conv", "autocast_fp32", "vector")


@dataclass(frozen=True)
class RowMath:
    """Storage dtype and math of a group of rows. `tf32_if_available`: TF32 math where the device has it."""

    dtype: str
    math: str
    tf32_if_available: bool = False


_FP32 = RowMath("fp32", "fp32")
_TF32 = RowMath("fp32", "fp32", tf32_if_available=True)
_FP16 = RowMath("fp16", "fp16")
_BF16 = RowMath("bf16", "bf16")

MATH_TABLE: dict[Precision, dict[str, RowMath]] = {
    Precision.fp32_strict: dict.fromkeys(GROUPS, _FP32),
    Precision.fp32: {"matmul": _FP32, "conv": _TF32, "autocast_fp32": _FP32, "vector": _FP32},
    Precision.tf32: {"matmul": _TF32, "conv": _TF32, "autocast_fp32": _FP32, "vector": _FP32},
    Precision.amp: {"matmul": _FP16, "conv": _FP16, "autocast_fp32": _FP32, "vector": _FP16},
    Precision.amp_bf16: {"matmul": _BF16, "conv": _BF16, "autocast_fp32": _FP32, "vector": _BF16},
    Precision.fp16: dict.fromkeys(GROUPS, _FP16),
    Precision.bf16: dict.fromkeys(GROUPS, _BF16),
    Precision.fp16_master: dict.fromkeys(GROUPS, _FP16),
    Precision.bf16_master: dict.fromkeys(GROUPS, _BF16),
}


CUDA_CORE_CONV_MATH = "fp32"  # a dilated or depthwise convolution's math: FMA on the CUDA cores, at the fp32 peak

GROUP_OF_KIND: dict[str, str] = {**dict.fromkeys(MATMUL_KINDS, "matmul"), **dict.fromkeys(CONV_KINDS, "conv"),
                                  **dict.fromkeys(AUTOCAST_FP32_KINDS, "autocast_fp32")}


def group_of(kind: str) -> str:
    """The math group of an IR kind (`vector` for every kind the table does not name)."""
    return GROUP_OF_KIND.get(kind, "vector")


# The faster float32 maths of a float32 precision: a job is never answered faster in fp32-strict than in fp32 or
# tf32, nor in fp32 than in tf32. Each math keeps the whole-step correction of its own step (its measured level, the
# device effect of its GEMMs' peak); where the faster math barely changes the kernels, the corrections alone could
# order the answers the other way, so `PlacementPredictor` raises such a step to its faster twins'
# (`faster_twins`: those whose maths differ on the device; `WholeStepStage.at_least`).
FASTER_FLOAT32: dict[Precision, tuple[Precision, ...]] = {
    Precision.fp32_strict: (Precision.fp32, Precision.tf32), Precision.fp32: (Precision.tf32,)}


FLOAT32_MATHS = (Precision.fp32_strict, *FASTER_FLOAT32[Precision.fp32_strict])  # the same rows, GEMMs in other maths


def faster_twins(precision: Precision, spec: HardwareSpec) -> tuple[Precision, ...]:
    """The faster float32 maths of `precision` (`FASTER_FLOAT32`) that run other maths than it on `spec`."""
    twins = FASTER_FLOAT32.get(precision, ())
    if not twins:
        return ()
    own = maths_by_group(precision, spec)
    return tuple(t for t in twins if maths_by_group(t, spec) != own)


def row_maths(kinds: pd.Series, cuda_core: np.ndarray, table: dict[str, RowMath]) -> np.ndarray:
    """The math of kernel rows of IR `kinds` under a resolved table (`resolved_table`): their group's, a CUDA-core
    convolution's (`cuda_core`: dilated or depthwise) `CUDA_CORE_CONV_MATH` whatever the precision."""
    by_kind = {kind: table[group].math for kind, group in GROUP_OF_KIND.items()}
    maths = kinds.map(by_kind).fillna(table["vector"].math).to_numpy(dtype=object)
    return np.where(cuda_core, CUDA_CORE_CONV_MATH, maths) if cuda_core.any() else maths


def resolved_table(precision: Precision, spec: HardwareSpec) -> dict[str, RowMath]:
    """{group: RowMath} of a precision on a device, TF32 resolved (TF32 math where the device has it)."""
    tf32 = has_tf32(spec)
    return {group: RowMath(entry.dtype, "tf32" if entry.tf32_if_available and tf32 else entry.math)
            for group, entry in MATH_TABLE[precision].items()}


def maths_by_group(precision: Precision, spec: HardwareSpec) -> dict[str, str]:
    """{group: math} of a precision on a device: what a prediction says each op group was priced at."""
    return {group: entry.math for group, entry in resolved_table(precision, spec).items()}


def conv_flop_share(totals: GraphTotals) -> float:
    """The share of a graph's forward FLOPs in convolutions (`CONV_KINDS`; the backward keeps the forward's mix):
    what the fleet calibration's op-mix effect multiplies (`perfmodel.calibration.fleet`)."""
    conv = sum(totals.flops_fwd_by_kind.get(kind, 0) for kind in CONV_KINDS)
    return conv / totals.flops_fwd if totals.flops_fwd > 0 else 0.0

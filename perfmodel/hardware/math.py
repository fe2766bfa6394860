"""The peak FLOP/s of each math on a device: one place for what the catalog's peak fields mean to a kernel.

Maths: `fp32` (CUDA cores / vector ALUs; on AMD CDNA, GEMMs run on the fp32 matrix cores, as rocBLAS does), `tf32`,
`fp16`, `bf16`, `fp8` (dense tensor/matrix-core peaks; fp16 with fp32 accumulate, as cuBLAS runs PyTorch's half
GEMMs). A math the device does not accelerate runs at its fp32 rate (bf16 on a V100). Vector kernels (element-wise,
softmax, norms) never run on tensor cores: their peak is the fp32 vector rate whatever the math. Where a compute
unit has more fp32 lanes than its warp schedulers issue to in one instruction per warp (Kepler), the peak is what
they can issue to.
"""

from __future__ import annotations

from perfmodel.hardware.spec import HardwareSpec

MATHS = ("fp32", "tf32", "fp16", "bf16", "fp8")
TENSOR_MATHS = frozenset({"tf32", "fp16", "bf16", "fp8"})


# micro-architectures with tensor / matrix cores, and those without (Pascal's and GCN's fast fp16 is packed vector math)
TENSOR_CORE_ARCHITECTURES = frozenset({"volta", "turing", "ampere", "ada", "hopper", "blackwell", "cdna", "cdna2",
                                       "cdna3", "cdna4"})
VECTOR_ONLY_ARCHITECTURES = frozenset({"kepler", "maxwell", "pascal", "gcn", "gcn5", "rdna", "rdna2"})
# a dense fp16 peak this many times the fp32 one is tensor / matrix math: packed half vectors give at most 2x
TENSOR_FP16_RATIO = 3.0


def tensor_peaks_given(spec: HardwareSpec) -> bool:
    """The sheet's peaks show tensor / matrix cores: a TF32, bf16 or fp8 peak (only matrix units have one), or an
    fp16 peak of at least `TENSOR_FP16_RATIO` x fp32. It agrees with the architecture of every catalog GPU."""
    return (any(p is not None for p in (spec.peak_tf32_gflops, spec.peak_bf16_gflops, spec.peak_fp8_gflops))
            or (spec.peak_fp16_gflops or 0.0) >= TENSOR_FP16_RATIO * spec.peak_fp32_gflops)


def has_tensor_cores(spec: HardwareSpec) -> bool:
    """By the architecture where it is a known one; else (a spec sheet that names none, or one newer than this
    table) by what its peaks show (`tensor_peaks_given`)."""
    architecture = (spec.architecture or "").lower()
    if architecture in TENSOR_CORE_ARCHITECTURES | VECTOR_ONLY_ARCHITECTURES:
        return architecture in TENSOR_CORE_ARCHITECTURES
    return tensor_peaks_given(spec)


def on_tensor_cores(spec: HardwareSpec, math: str, gemm: bool = True) -> bool:
    """A kernel of `math` runs on tensor / matrix cores: a GEMM or convolution in a tensor math on a device that
    has them."""
    return gemm and math in TENSOR_MATHS and has_tensor_cores(spec)


def has_tf32(spec: HardwareSpec) -> bool:
    """TF32 as PyTorch's TF32 switches turn it on: NVIDIA tensor cores from Ampere on."""
    return spec.vendor.upper() == "NVIDIA" and spec.peak_tf32_gflops is not None


# fp32 lanes one compute unit's warp schedulers can feed per clock with one instruction per warp (no dual issue), by
# vendor. Every NVIDIA SM since Kepler has four warp schedulers that each issue one 32-thread instruction per clock:
# 128 lanes. Kepler's SMX has 192 fp32 lanes: the CUDA C Programming Guide (compute capability 3.x) counts on pairs of
# independent instructions from one warp to issue more, so a kernel reaches at most 128 / 192 of the datasheet's fp32
# peak without instruction-level parallelism (Maxwell and later have at most as many lanes as the schedulers issue
# to). By vendor, not by architecture, so that a spec sheet that names no architecture but gives (or is imputed)
# 192 lanes per SM is priced as the Kepler it is.
ISSUE_LANES_PER_CU: dict[str, int] = {"NVIDIA": 128}


def fp32_issue_fraction(spec: HardwareSpec) -> float:
    """The share of the datasheet fp32 peak the warp schedulers can issue to without dual issue
    (`ISSUE_LANES_PER_CU`); 1 where the vendor is not listed or the lanes per compute unit are not known."""
    lanes = ISSUE_LANES_PER_CU.get(spec.vendor.upper())
    if lanes is None or not spec.fp32_cores_per_cu:
        return 1.0
    return min(1.0, lanes / spec.fp32_cores_per_cu)


def peak_gflops(spec: HardwareSpec, math: str, gemm: bool = True) -> float:
    """The dense peak, GFLOP/s, that a kernel of `math` (a GEMM or convolution when `gemm`) reaches on `spec`: the
    datasheet's, less what the warp schedulers cannot issue to (`fp32_issue_fraction`)."""
    if math not in MATHS:
        raise ValueError(f"unknown math {math!r}; known: {', '.join(MATHS)}")
    vector = spec.peak_fp32_gflops * fp32_issue_fraction(spec)
    if not gemm:
        return vector
    fp32 = max(vector, spec.peak_fp32_matrix_gflops or 0.0)
    tensor = {"fp32": None, "tf32": spec.peak_tf32_gflops, "fp16": spec.peak_fp16_gflops,
              "bf16": spec.peak_bf16_gflops, "fp8": spec.peak_fp8_gflops or spec.peak_fp16_gflops}[math]
    return max(tensor or 0.0, fp32)

"""What perfmodel knows about an accelerator: its measured or spec-sheet properties, never an id.

Features built from a `HardwareSpec` use its numbers only (peak FLOP/s, memory bandwidth, cores, ...), so a
predictor trained on some devices can answer for a device described only by its spec sheet.

Every figure is per device as torch sees it (`torch.device("cuda:0")`): for a package that shows up as several
devices (an AMD MI250/MI250X is two GCDs, each its own torch device) the figures are per device, not per package.
Peaks are dense (no 2:4 structured sparsity). Units are in the field names; GB/s are 1e9 bytes a second, and memory
sizes are binary as spec sheets write them (`memory_gb`: an "80GB" GPU holds 80 x 2^30 bytes).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfmodel.core.renamed import upgrade_names
from perfmodel.core.units import BYTES_PER_MIB, gib_to_bytes

# glibc's allocator maps a block of at least this many bytes afresh on every allocation (its dynamic mmap threshold
# stops growing at 32 MiB on 64-bit hosts), and PyTorch keeps no cache of CPU memory: a CPU tensor this large faults
# its pages in each time it is created (`HardwareSpec.first_touch_gb_s`); smaller ones reuse freed heap
FRESH_MAP_BYTES = 32 * BYTES_PER_MIB


class HardwareSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # --- identity -------------------------------------------------------------------------------------------------
    name: str = Field(description="catalog id, e.g. cpu, a100-sxm4-40gb")
    kind: Literal["cpu", "gpu"]
    vendor: str = ""
    aliases: tuple[str, ...] = Field(default=(), description="other names, incl. torch's device name strings")
    architecture: str | None = Field(default=None, description="micro-architecture, lower case: volta, ampere, "
                                                               "hopper, cdna2, ...")
    release_year: int | None = Field(default=None, ge=1990, le=2100, description="year the part was launched")
    form_factor: str | None = Field(default=None, description="sxm, pcie, oam, socket, ...")

    # --- compute peaks (GFLOP/s, dense) ---------------------------------------------------------------------------
    peak_fp32_gflops: float = Field(gt=0, description="dense fp32 peak without tensor/matrix cores: CUDA cores / "
                                                      "vector ALUs x 2 x boost clock (measured GEMM for probed CPUs)")
    peak_fp32_matrix_gflops: float | None = Field(default=None, gt=0,
                                                  description="fp32 on matrix cores (AMD CDNA MFMA); None elsewhere")
    peak_tf32_gflops: float | None = Field(default=None, gt=0, description="dense TF32 tensor-core peak (NVIDIA "
                                                                           "Ampere+, AMD CDNA3); None where absent")
    peak_fp16_gflops: float | None = Field(default=None, gt=0,
                                           description="dense fp16 peak: tensor/matrix cores with fp32 accumulate "
                                                       "where present, else packed-half vector rate; None where "
                                                       "fp16 is no faster than fp32")
    peak_bf16_gflops: float | None = Field(default=None, gt=0, description="dense bf16 tensor/matrix peak; None where "
                                                                           "bf16 is not accelerated")
    peak_fp8_gflops: float | None = Field(default=None, gt=0, description="dense fp8 tensor peak (fp32 accumulate); "
                                                                          "None where absent")
    peak_fp64_gflops: float | None = Field(default=None, gt=0, description="dense fp64 vector (non-tensor) peak")

    # --- memory ---------------------------------------------------------------------------------------------------
    memory_bandwidth_gb_s: float = Field(gt=0, description="GB/s (1e9 bytes/s)")
    memory_gb: float = Field(gt=0, description="device memory (host RAM for a CPU) as spec sheets write it, in "
                                               "binary GB: an \"80GB\" GPU holds 80 x 2^30 bytes (GiB)")
    memory_type: str | None = Field(default=None, description="HBM2, HBM2e, HBM3, GDDR6, GDDR6X, DDR4, ...")
    l2_cache_mb: float | None = Field(default=None, gt=0, description="L2 cache, MB (total over the device)")

    # --- execution units and clocks -------------------------------------------------------------------------------
    compute_units: int = Field(gt=0, description="SMs / CUs on a GPU, physical cores on a CPU")
    fp32_cores_per_cu: int | None = Field(default=None, gt=0, description="fp32 lanes per compute unit: CUDA cores "
                                                                          "per SM, stream processors per CU")
    threads: int | None = Field(default=None, gt=0, description="CPU threads torch uses (CPU entries)")
    first_touch_gb_s: float | None = Field(
        default=None, gt=0, exclude_if=lambda rate: rate is None,
        description="GB/s at which the host faults in the pages of a new tensor of `FRESH_MAP_BYTES` or more "
                    "(CPU entries, measured by `hw bench` and `hw probe`): what such a tensor costs beside its "
                    "kernel's time; None: nothing measurable")
    boost_clock_mhz: float | None = Field(default=None, gt=0, description="boost / peak engine clock, MHz (the "
                                                                          "clock the datasheet peaks assume)")
    base_clock_mhz: float | None = Field(default=None, gt=0, description="base clock, MHz")

    # --- board, power, links --------------------------------------------------------------------------------------
    tdp_w: float | None = Field(default=None, gt=0, description="board power / TDP, W")
    pcie_gen: int | None = Field(default=None, ge=1, le=7, description="PCIe generation of the host link")
    interconnect: str | None = Field(default=None, description="GPU-to-GPU link: nvlink1..5, nvlink3-bridge, "
                                                               "infinity-fabric, pcie, ...")
    interconnect_bidir_gb_s: float | None = Field(default=None, gt=0,
                                                      description="total GPU-to-GPU link bandwidth per device, "
                                                                  "bidirectional GB/s as the vendor quotes it; "
                                                                  "None for PCIe-only parts")

    peer_to_peer: Literal["nvlink", "pcie", "none"] | None = Field(
        default=None, description="how two devices of one node exchange data: nvlink (NVLink, NVSwitch, Infinity "
                                  "Fabric), pcie (PCIe peer-to-peer), none (staged through host memory: GeForce cards "
                                  "since the RTX 4090, and others whose driver disables P2P); None: unknown (GPUs are "
                                  "then assumed to have PCIe P2P)")
    node_devices: int | None = Field(default=None, gt=0, description="devices per node in the typical server of this "
                                                                    "accelerator (8 on SXM / OAM boards)")
    node_network_gbit_s: float | None = Field(
        default=None, gt=0, description="typical network bandwidth of one such server, Gb/s (1e9 bit/s) summed over "
                                        "its NICs, e.g. 3200 for 8 x 400 Gb/s on an H100 SXM server")

    source: str = Field(description="where the figures come from: a datasheet, or `perfmodel hw probe` on a host")

    @model_validator(mode="before")
    @classmethod
    def _renamed_fields(cls, data: Any) -> Any:
        """Inputs written before the renames of issue 15 (`perfmodel.core.renamed`) under today's names."""
        return upgrade_names(data)

    @property
    def memory_bytes(self) -> int:
        """Device memory in bytes (`memory_gb` GiB)."""
        return gib_to_bytes(self.memory_gb)

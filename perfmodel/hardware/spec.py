"""What perfmodel knows about an accelerator: its measured or spec-sheet properties, never an id.

Features built from a `HardwareSpec` use its numbers only (peak FLOP/s, memory bandwidth, cores, ...), so a
predictor trained on some devices can answer for a device described only by its spec sheet.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class HardwareSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="catalog id, e.g. cpu, a100-sxm4-40gb")
    kind: Literal["cpu", "gpu"]
    vendor: str = ""
    aliases: tuple[str, ...] = Field(default=(), description="other names, incl. torch's device name strings")
    peak_fp32_gflops: float = Field(gt=0, description="dense fp32 peak (measured GEMM for probed CPUs)")
    peak_fp16_gflops: float | None = Field(default=None, gt=0, description="dense fp16/bf16 tensor peak")
    memory_bandwidth_gbps: float = Field(gt=0, description="GB/s (1e9 bytes/s)")
    memory_gb: float = Field(gt=0, description="device memory (host RAM for a CPU), 1e9 bytes")
    compute_units: int = Field(gt=0, description="SMs / CUs on a GPU, physical cores on a CPU")
    threads: int | None = Field(default=None, gt=0, description="CPU threads torch uses (CPU entries)")
    l2_cache_mb: float | None = None
    source: str = Field(description="where the figures come from: a datasheet, or `perfmodel hw probe` on a host")

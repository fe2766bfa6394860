"""Spec-sheet fields a learned feature needs but an entry does not give, filled in before features are built.

A tree model given NaN for a field it never saw missing follows an arbitrary branch (a B200 with no L2 size got
57 µs for an 8-byte add), so a missing field is never passed on as NaN:
- `boost_clock_mhz` follows from physics: fp32 peak = fp32 lanes × 2 FLOPs × clock;
- `l2_cache_mb`, `fp32_cores_per_cu` and `tdp_w` come from another SKU of the same die where the catalog has one,
  the one with the nearest compute (log peak fp32, log tensor peak, log compute units: a GH200 takes the H100
  SXM's board power, not a 400 W H100 NVL's, so that two SKUs of one die at the same peaks are the same device to
  the learned models, memory apart); else from the nearest reference device of the same kind and vendor by the
  same compute distance. Never by the memory bandwidth: a sheet with less bandwidth must be the same device
  otherwise (the per-op model is monotone in the bandwidth only if nothing else moves with it; by bandwidth, an RTX
  A4500 sheet under another name took 4 MB of L2 at its own bandwidth and an Ada card's 48 MB at half of it).
  The prediction says which.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from perfmodel.hardware.chips import die_of
from perfmodel.hardware.spec import HardwareSpec

NEIGHBOUR_FIELDS = ("l2_cache_mb", "fp32_cores_per_cu", "tdp_w")


def derived_boost_clock_mhz(spec: HardwareSpec) -> float | None:
    """The clock the fp32 peak implies: peak / (2 × fp32 lanes); None without the lane count."""
    if not spec.fp32_cores_per_cu:
        return None
    return spec.peak_fp32_gflops * 1e3 / (2 * spec.compute_units * spec.fp32_cores_per_cu)


def _compute_distance(a: HardwareSpec, b: HardwareSpec) -> float:
    def tensor(spec: HardwareSpec) -> float:
        return spec.peak_fp16_gflops or spec.peak_bf16_gflops or spec.peak_fp32_gflops

    return math.dist((math.log(a.peak_fp32_gflops), math.log(tensor(a)), math.log(a.compute_units)),
                     (math.log(b.peak_fp32_gflops), math.log(tensor(b)), math.log(b.compute_units)))


def imputed(spec: HardwareSpec, reference: Iterable[HardwareSpec]) -> tuple[HardwareSpec, dict[str, str]]:
    """`spec` with its missing feature fields filled, and {field: where its value came from} for each one filled."""
    filled: dict[str, object] = {}
    origin: dict[str, str] = {}
    missing = [field for field in NEIGHBOUR_FIELDS if getattr(spec, field) is None]
    if missing:
        candidates = [r for r in reference if r.kind == spec.kind and r.name != spec.name
                      and all(getattr(r, field) is not None for field in missing)]
        die = die_of(spec.name)
        same_die = [r for r in candidates if die != spec.name and die_of(r.name) == die]
        same_vendor = [r for r in candidates if r.vendor == spec.vendor] or candidates
        if same_die:
            nearest = min(same_die, key=lambda r: (_compute_distance(spec, r), r.name))
            how = f"taken from another SKU of its die ({die}), {nearest.name}"
        elif same_vendor:
            nearest = min(same_vendor, key=lambda r: (_compute_distance(spec, r), r.name))
            how = f"taken from the nearest catalog device, {nearest.name}"
        if same_die or same_vendor:
            for field in missing:
                filled[field] = getattr(nearest, field)
                origin[field] = how
    if spec.boost_clock_mhz is None:
        clock = derived_boost_clock_mhz(spec.model_copy(update=filled))
        if clock is not None:
            filled["boost_clock_mhz"] = clock
            origin["boost_clock_mhz"] = "derived from the fp32 peak and the fp32 lanes"
    return (spec.model_copy(update=filled) if filled else spec), origin

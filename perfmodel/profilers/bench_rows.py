"""Timings of `perfmodel hw bench` as `op_measurements` rows (pure functions: no device, no store).

A row is an `OpMeasurement` of source `microbench`: `device` the catalog id, `source_file` the run
(`microbench/<run id>/<device>`), `source_row` a stable number of the shape (from its key), the shape's fields, and
`Timing.latency_ms` (median of CUDA events; fastest `perf_counter` call) as `latency_ms`. `extra` keeps the shape key
(what a resumed run compares), every sample, the warm-up count, the timer, the software versions, the device's
probed properties and, for a real op's row, the op, the row's part and the op's input (`real_op_extra`). The row's
identity (`measurement_uid`: source, file, row, op, phase) is therefore fixed by run, device and shape: storing the
same shape of the same run again adds nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from perfmodel.profilers.external import OpMeasurement, Source
from perfmodel.profilers.microbench import BENCH_FIELDS, BenchShape, Timing

SOURCE: Source = "microbench"


def run_file(run_id: str, device: str) -> str:
    return f"{SOURCE}/{run_id}/{device}"


def shape_row(key: str) -> int:
    """A stable non-negative int of a shape key (31 bits of its SHA-256)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


def software_versions() -> dict[str, str | None]:
    import torch

    import perfmodel

    return {"torch": torch.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip,
            "perfmodel": perfmodel.__version__}


def real_op_extra(shape: BenchShape) -> dict[str, Any]:
    """What a row of a real op (`perfmodel.profilers.lowered_ops`) keeps of it: the op, the row's part and the
    op's input; nothing for another row."""
    if shape.real_op is None:
        return {}
    return {"real_op": shape.real_op, "part": shape.part, "tensor": list(shape.tensor or ())}


def timing_rows(timings: Iterable[Timing], device: str, run_id: str, versions: Mapping[str, Any],
                properties: Mapping[str, Any]) -> list[OpMeasurement]:
    """One `OpMeasurement` per timing (latency: `Timing.latency_ms`)."""
    out = []
    for timing in timings:
        shape = timing.shape
        dims = {name: getattr(shape, name) for name in BENCH_FIELDS if getattr(shape, name) is not None}
        out.append(OpMeasurement(
            source=SOURCE, source_file=run_file(run_id, device), source_row=shape_row(shape.key), device=device,
            op_class=shape.op_class, op_name=shape.op_name, dtype=shape.dtype, phase="forward", **dims,
            latency_ms=max(timing.latency_ms, 1e-6),
            extra={"shape_key": shape.key, "samples_ms": list(timing.samples_ms), "warmup": timing.warmup,
                   "timer": timing.timer, "versions": dict(versions), "device_properties": dict(properties),
                   **real_op_extra(shape)}))
    return out


def done_keys(stored: pd.DataFrame, run_id: str, device: str) -> set[str]:
    """Shape keys already stored for this run on this device (`stored`: `ProfileStore.op_measurements` of source
    `microbench` with `extra`)."""
    if stored.empty:
        return set()
    mine = stored[stored["source_file"] == run_file(run_id, device)]
    return {str(e["shape_key"]) for e in mine["extra"] if isinstance(e, dict) and e.get("shape_key") is not None}


__all__ = ["SOURCE", "done_keys", "real_op_extra", "run_file", "shape_row", "software_versions", "timing_rows"]

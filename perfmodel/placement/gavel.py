"""Throughput matrices in the layout Gavel's scheduler reads (Narayanan et al., OSDI'20, stanford-futuredata/gavel).

Gavel keys a job type by the string of the tuple (model name, scale factor), e.g. "('resnet50 (batch size 32)', 4)"
for 4 workers, and holds `{job_type: {worker_type: throughput}}` (samples/s). Gavel has no notion of where the
workers sit, so perfmodel writes two matrices of that layout: `consolidated` (the scale factor's devices packed on as
few nodes as possible) and `spread` (one device per node); a placement-aware scheduler reads both, a plain Gavel
reads `consolidated`.
"""

from __future__ import annotations

from collections.abc import Iterable

GavelMatrix = dict[str, dict[str, float]]


def job_type_key(job_type: str, scale_factor: int) -> str:
    """Gavel's job-type key: the string of the tuple (job type, scale factor)."""
    return str((job_type, scale_factor))


def gavel_layout(entries: Iterable[tuple[str, str, int, bool, float]]) -> dict[str, GavelMatrix]:
    """(job_type, worker_type, scale_factor, consolidated, throughput) rows → {"consolidated": M, "spread": M}.
    A 1-device placement is both consolidated and spread: it appears in both matrices."""
    out: dict[str, GavelMatrix] = {"consolidated": {}, "spread": {}}
    for job_type, worker_type, scale_factor, consolidated, throughput in entries:
        if scale_factor < 1:
            raise ValueError(f"scale_factor must be >= 1, got {scale_factor}")
        kinds = ("consolidated", "spread") if scale_factor == 1 else ("consolidated" if consolidated else "spread",)
        for kind in kinds:
            out[kind].setdefault(job_type_key(job_type, scale_factor), {})[worker_type] = float(throughput)
    return out

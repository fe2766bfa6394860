"""Throughput matrices in the layout Gavel's scheduler reads (Narayanan et al., OSDI'20, stanford-futuredata/gavel).

Gavel keys a job type by the string of the tuple (model name, scale factor), e.g. "('resnet50 (batch size 32)', 4)"
for 4 workers, and holds `{job_type: {worker_type: throughput}}` (samples/s). Gavel has no notion of where the
workers sit, so perfmodel writes two matrices of that layout: `consolidated` (the scale factor's devices packed on as
few nodes as possible) and `spread` (one device per node); a placement-aware scheduler reads both, a plain Gavel
reads `consolidated`.

The grid (jobs x worker types x scale factors -> both matrices) is built here once for its two users, `perfmodel
export gavel` and the service's `/v1/predict/matrix` with `layout: gavel`: `grid_layouts` gives the placements of a
scale factor, the caller predicts each job on each, and `gavel_matrices` turns that throughput table into the
matrices (`job_type_names` names the rows).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

GavelMatrix = dict[str, dict[str, float]]
Layout = tuple[int, ...]  # devices on each node


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


def grid_layouts(devices: int, per_node: int | None, *, spread: bool = True) -> list[tuple[Layout, bool]]:
    """The placements of `devices` devices as (devices per node, consolidated) pairs: consolidated, packed on as
    few nodes of `per_node` devices as possible (one node when `per_node` is None), and with `spread`, one device per
    node too where that is a different layout."""
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    full_node = min(per_node or devices, devices)
    full, rest = divmod(devices, full_node)
    layouts = [((full_node,) * full + ((rest,) if rest else ()), True)]
    if spread and full_node > 1:
        layouts.append(((1,) * devices, False))
    return layouts


def job_type_names(jobs: Sequence[tuple[str, str, int]]) -> list[str]:
    """Gavel's job type of each (job id, model name, batch size): "<name> (batch size <b>)", with the job id added
    where two different jobs would share one."""
    names = {key: f"{name} (batch size {batch_size})" for key, name, batch_size in jobs}  # a job listed twice: once
    counts: dict[str, int] = {}
    for name in names.values():
        counts[name] = counts.get(name, 0) + 1
    return [names[key] if counts[names[key]] == 1 else f"{names[key]} [{key}]" for key, _, _ in jobs]


def gavel_matrices(job_types: Sequence[str], columns: Sequence[tuple[str, Layout, bool]],
                   throughput: Sequence[Sequence[float]]) -> dict[str, GavelMatrix]:
    """A throughput table (`throughput[i][j]`, samples/s: job i on placement j; 0 where the job does not fit) as
    Gavel's matrices. `columns[j]` is placement j's (worker type, devices per node, consolidated); a placement of one
    device per node is also the spread one of its scale factor, whatever its flag."""
    def cells() -> Iterable[tuple[str, str, int, bool, float]]:
        for i, job_type in enumerate(job_types):
            for j, (worker_type, layout, consolidated) in enumerate(columns):
                scale_factor = sum(layout)
                yield job_type, worker_type, scale_factor, consolidated, throughput[i][j]
                if consolidated and scale_factor > 1 and max(layout) == 1:
                    yield job_type, worker_type, scale_factor, False, throughput[i][j]

    return gavel_layout(cells())

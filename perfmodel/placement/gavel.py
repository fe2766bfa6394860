"""Throughputs in the file Gavel's scheduler and simulator read (Narayanan et al., OSDI'20, stanford-futuredata/gavel,
`scheduler/*throughputs*.json`):

    {worker_type: {"(JOB_TYPE, SCALE_FACTOR)": {"null": steps/s alone,
                                                "(OTHER_JOB_TYPE, SCALE_FACTOR)": [this, other] steps/s sharing}}}

Keys are the `str()` of a Python tuple (Gavel reads them back as tuples). Values are training steps per second: for
a scale factor n, the sum over the n data-parallel workers of each worker's steps/s, each with the job type's batch
(= the job's global samples/s / the per-worker batch). Placements with one worker per server are worker type
`<worker_type>_unconsolidated`; a single worker is both. A pair entry is both jobs sharing the same GPU(s) at the same
scale factor (`perfmodel.placement.colocation`); a job that does not fit gets 0, and so does a pair that does not fit
together.

The grid (jobs x worker types x scale factors) is built here once for its two users, `perfmodel export gavel` and
the service's `/v1/predict/matrix` with `layout: gavel`: `grid_layouts` gives the placements of a scale factor, the
caller predicts each job on each (and each pair, when asked), and `gavel_file` lays them out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Layout = tuple[int, ...]  # devices on each node


def job_type_key(job_type: str, scale_factor: int) -> str:
    """Gavel's job-type key: the string of the tuple (job type, scale factor)."""
    return str((job_type, scale_factor))


UNCONSOLIDATED = "_unconsolidated"


def worker_keys(worker_type: str, layout: Layout, consolidated: bool) -> list[str]:
    """The worker types a placement is filed under: consolidated ones under `worker_type`, one device per server
    under `<worker_type>_unconsolidated`; one device, or one device on each of n servers packed as far as the node
    allows, under both."""
    spread = max(layout) == 1
    keys = []
    if consolidated:
        keys.append(worker_type)
    if spread:
        keys.append(worker_type + UNCONSOLIDATED)
    return keys


def gavel_file(job_types: Sequence[str], columns: Sequence[tuple[str, Layout, bool]],
               steps_per_s: Sequence[Sequence[float]],
               pairs: Mapping[tuple[int, int, int], tuple[float, float]] | None = None
               ) -> dict[str, dict[str, dict[str, float | list[float]]]]:
    """Gavel's throughputs file. `steps_per_s[i][j]`: job i alone on placement j (`columns[j]`: worker type,
    devices per node, consolidated); `pairs[(i, k, j)]`: (job i, job k) sharing placement j."""
    out: dict[str, dict[str, dict[str, float | list[float]]]] = {}
    for j, (worker_type, layout, consolidated) in enumerate(columns):
        scale_factor = sum(layout)
        for key in worker_keys(worker_type, layout, consolidated):
            table = out.setdefault(key, {})
            for i, job_type in enumerate(job_types):
                entry = table.setdefault(job_type_key(job_type, scale_factor), {})
                entry["null"] = float(steps_per_s[i][j])
                for k, other in enumerate(job_types):
                    pair = (pairs or {}).get((i, k, j))
                    if pair is not None:
                        entry[job_type_key(other, scale_factor)] = [float(pair[0]), float(pair[1])]
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
    """The default job type of each (job id, model name, batch size) where the user names none: "<name> (batch size
    <b>)", Gavel's pattern, with the job id added where two different jobs would share one."""
    names = {key: f"{name} (batch size {batch_size})" for key, name, batch_size in jobs}  # a job listed twice: once
    counts: dict[str, int] = {}
    for name in names.values():
        counts[name] = counts.get(name, 0) + 1
    return [names[key] if counts[names[key]] == 1 else f"{names[key]} [{key}]" for key, _, _ in jobs]

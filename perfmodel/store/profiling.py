"""Profiling into the store: real profiles of jobs (perfmodel/profilers/run.py) added to a `ProfileStore`, either
here one job after another (`profile_into_store`, what `perfmodel profile` runs) or as Ray tasks (`profile_on_ray`,
`perfmodel profile --ray ADDRESS`; perfmodel/profilers/ray_fanout.py), each task writing its own result to the
shared store as its last step, in one transaction, idempotent by run id + job key (`ProfileStore.add_once` under
`result_uid`). Either way a job the store already has on the device is skipped unless `force`: sweeps resume.

The graph IR a job's ops are matched against is the store's (`ProfileStore.graph`) when it has one, else it is
captured once and stored (`add_graph`) before the match, so the profile and its graph travel together (export,
training). `add_missing_graphs` fills in the graphs of runs profiled before the store kept them."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph
from perfmodel.profilers.ray_fanout import FanoutResult, FanoutTask, RayOptions, gpus_for, result_uid, run_on_ray


@dataclass(frozen=True)
class ProfiledJob:
    """One job of a sweep: skipped (the store had it), failed (`error`), or profiled and stored as `profile_id`."""

    spec: Any  # JobSpec
    profile: Any = None  # Profile
    profile_id: int | None = None
    skipped: bool = False
    error: str | None = None


@dataclass(frozen=True)
class GraphFill:
    """What `add_missing_graphs` did for one profiled job: added its graph, or skipped it (`reason`)."""

    job_key: str
    job_name: str
    added: bool
    reason: str | None = None


def _stored_or_captured(open_store: Callable[[], Any]) -> Callable[[Any, Callable[[str], None]], Graph | None]:
    """A `graph_for` for `profile_job`: the store's graph of the job, else a fresh capture, stored before it is used
    (a failed capture: None, nothing stored). `open_store` gives a context manager yielding the ProfileStore."""
    from perfmodel.profilers.run import capture_graph_or_none

    def graph_for(spec: Any, say: Callable[[str], None]) -> Graph | None:
        with open_store() as store:
            try:
                graph = store.graph(spec.key())
            except PerfmodelError as exc:  # e.g. stored under an older IR schema: match a fresh capture
                say(f"{exc}; capturing it again")
                graph = None
        if graph is not None:
            say("using the graph stored with the job's earlier profiles")
            return graph
        graph = capture_graph_or_none(spec, say)
        if graph is not None:
            with open_store() as store:
                store.add_graph(spec.key(), graph)
        return graph

    return graph_for


def add_missing_graphs(store: Any, *, progress: Callable[[str], None] | None = None) -> list[GraphFill]:
    """Capture and store the graph of every profiled job of the open ProfileStore `store` that has none (runs
    profiled or imported before the store kept graphs). ONNX jobs have no graph IR and jobs whose capture fails
    (PerfmodelError) are reported through `progress` and skipped; one `GraphFill` per job looked at."""
    from perfmodel.jobs.spec import OnnxSource
    from perfmodel.profilers.run import capture_graph_or_none

    say = progress or (lambda message: None)
    jobs = store.profiled_jobs(without_graph=True)
    say(f"{len(jobs)} profiled job(s) without a stored graph")
    fills = []
    for i, (key, spec) in enumerate(jobs, start=1):
        prefix = f"[{i}/{len(jobs)}] {spec.name} ({key[:12]})"
        if isinstance(spec.source, OnnxSource):
            say(f"{prefix}: skipped, an ONNX job has no graph IR")
            fills.append(GraphFill(key, spec.name, added=False, reason="ONNX job"))
            continue
        failures: list[str] = []
        graph = capture_graph_or_none(spec, failures.append)
        if graph is None:
            reason = failures[-1] if failures else "capture failed"
            say(f"{prefix}: skipped, {reason}")
            fills.append(GraphFill(key, spec.name, added=False, reason=reason))
            continue
        if graph.job_id != key:  # the stored key predates a change of `JobSpec.key()`: the runs name the stored one
            graph = graph.model_copy(update={"job_id": key})
        added = store.add_graph(key, graph)
        say(f"{prefix}: {len(graph.nodes)} nodes " + ("stored" if added else "(stored meanwhile by another writer)"))
        fills.append(GraphFill(key, spec.name, added=added, reason=None if added else "stored meanwhile"))
    return fills


def profile_into_store(specs: Sequence[Any], device: str, store: Any, *, force: bool = False,
                       stop_on_error: bool = False, progress: Callable[[str], None] | None = None,
                       **options: Any) -> Iterator[ProfiledJob]:
    """Profile every JobSpec on `device` (cpu, cuda, cuda:N) and add it to the open ProfileStore `store`, yielding
    each job's outcome as it is done. A job that fails (PerfmodelError) is yielded with its error, or raised with
    `stop_on_error`. `options` go to `profile_job` (warmup, repeats, per_op, onnx, time_budget_s). Ops are matched
    to the store's graph of the job, else to one captured now and stored."""
    from perfmodel.profilers.env import capture_environment
    from perfmodel.profilers.run import profile_job
    from perfmodel.torch_device import resolve_device

    device_name = capture_environment(resolve_device(device)).device_name
    graph_for = _stored_or_captured(lambda: contextlib.nullcontext(store))  # open already: left open
    for spec in specs:
        if not force and store.has(spec.key(), device_name=device_name):
            yield ProfiledJob(spec, skipped=True)
            continue
        try:
            profile = profile_job(spec, device, progress=progress, graph_for=graph_for, **options)
        except PerfmodelError as exc:
            if stop_on_error:
                raise
            yield ProfiledJob(spec, error=str(exc))
            continue
        yield ProfiledJob(spec, profile=profile, profile_id=store.add(profile))


def profile_and_store(spec_json: dict[str, Any], device: str, store_url: str, run_id: str,
                      profile_options: dict[str, Any], force: bool = False) -> dict[str, Any]:
    """A Ray task's body: profile one job on this worker's device, then store it (the last step, one transaction,
    idempotent by run id + job key). On a GPU worker Ray sets CUDA_VISIBLE_DEVICES: `cuda` is the GPU it gave us."""
    from perfmodel.jobs.spec import JobSpec
    from perfmodel.profilers.env import capture_environment
    from perfmodel.profilers.run import profile_job
    from perfmodel.store import ProfileStore
    from perfmodel.torch_device import resolve_device

    spec = JobSpec.model_validate(spec_json)
    torch_device = resolve_device(device)
    device_name = capture_environment(torch_device).device_name
    with ProfileStore(store_url) as store:
        if not force and store.has(spec.key(), device_name=device_name):
            return {"job_name": spec.name, "job_id": spec.key(), "skipped": True, "device_name": device_name}
    profile = profile_job(spec, device, graph_for=_stored_or_captured(lambda: ProfileStore(store_url)),
                          **profile_options)
    with ProfileStore(store_url) as store:
        profile_id, added = store.add_once(profile, result_uid(run_id, spec.key(), device_name))
    outcome = profile.iteration.outcome.value if profile.iteration is not None else None
    return {"job_name": spec.name, "job_id": spec.key(), "profile_id": profile_id, "added": added,
            "device_name": device_name, "outcome": outcome,
            "iter_time_ms_median": profile.iteration.iter_time_ms_median if profile.iteration else None}


def profile_on_ray(specs: Sequence[Any], device: str, address: str | None, store_url: str | None, *,
                         force: bool = False, options: dict[str, Any] | None = None,
                         progress: Callable[[str], None] | None = None, run_id: str | None = None,
                         ray_options: RayOptions | None = None) -> list[dict[str, Any]]:
    """Profile every spec as a Ray task on `device` (of the worker Ray picks) and store each result; one dict per
    spec (the task's result, or {"job_name", "job_id", "error"}). `store_url` must be reachable from every worker
    (PostgreSQL on a cluster; a SQLite file only with a local Ray)."""
    from perfmodel.settings import Settings

    num_gpus = gpus_for(device)
    url = store_url or Settings().resolved_store_url()
    run_id = run_id or uuid4().hex
    say = progress or (lambda message: None)
    tasks = [FanoutTask(key=f"{spec.name}:{spec.key()[:12]}", num_gpus=num_gpus,
                        run=functools.partial(profile_and_store, spec.model_dump(mode="json"), device, url, run_id,
                                              dict(options or {}), force))
             for spec in specs]
    say(f"run {run_id}: {len(tasks)} job(s) as Ray tasks with num_gpus={num_gpus:g}")

    def report(result: FanoutResult) -> None:
        say(f"{result.key}: " + (f"error: {result.error}" if result.error else json.dumps(result.value)))

    results = run_on_ray(tasks, address, options=ray_options, on_result=report)
    return [r.value if r.ok else {"job_name": spec.name, "job_id": spec.key(), "error": r.error}
            for spec, r in zip(specs, results)]

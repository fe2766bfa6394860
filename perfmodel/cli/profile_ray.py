"""`perfmodel profile --ray ADDRESS`: each job of a sweep profiled as a Ray task (perfmodel/profilers/ray_fanout.py)
and written to the shared store by the task itself, as its last step, in one transaction, idempotent by run id + job
key (`ProfileStore.add_once` under `result_uid`)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any
from uuid import uuid4

from perfmodel.profilers.ray_fanout import FanoutResult, FanoutTask, RayOptions, gpus_for, result_uid, run_on_ray


def profile_and_store(spec_json: dict[str, Any], device: str, store_url: str, run_id: str,
                      profile_options: dict[str, Any], force: bool = False) -> dict[str, Any]:
    """A Ray task's body: profile one job on this worker's device, then store it (the last step, one transaction,
    idempotent by run id + job key). On a GPU worker Ray sets CUDA_VISIBLE_DEVICES: `cuda` is the GPU it gave us."""
    from perfmodel.device import resolve_device
    from perfmodel.jobs.spec import JobSpec
    from perfmodel.profilers.env import capture_environment
    from perfmodel.profilers.run import profile_job
    from perfmodel.store import ProfileStore

    spec = JobSpec.model_validate(spec_json)
    torch_device = resolve_device(device)
    device_name = capture_environment(torch_device).device_name
    with ProfileStore(store_url) as store:
        if not force and store.has(spec.key(), device_name=device_name):
            return {"job": spec.name, "job_key": spec.key(), "skipped": True, "device_name": device_name}
    profile = profile_job(spec, device, **profile_options)
    with ProfileStore(store_url) as store:
        profile_id, added = store.add_once(profile, result_uid(run_id, spec.key(), device_name))
    outcome = profile.iteration.outcome.value if profile.iteration is not None else None
    return {"job": spec.name, "job_key": spec.key(), "profile_id": profile_id, "added": added,
            "device_name": device_name, "outcome": outcome,
            "iter_time_ms_median": profile.iteration.iter_time_ms_median if profile.iteration else None}


def profile_specs_on_ray(specs: Sequence[Any], device: str, address: str | None, store_url: str | None, *,
                         force: bool = False, options: dict[str, Any] | None = None,
                         progress: Callable[[str], None] | None = None, run_id: str | None = None,
                         ray_options: RayOptions | None = None) -> list[dict[str, Any]]:
    """Profile every spec as a Ray task on `device` (of the worker Ray picks) and store each result; one dict per
    spec (the task's result, or {"job", "job_key", "error"}). `store_url` must be reachable from every worker
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
    return [r.value if r.ok else {"job": spec.name, "job_key": spec.key(), "error": r.error}
            for spec, r in zip(specs, results)]

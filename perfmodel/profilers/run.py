"""Profile one job on one device: environment, iteration timing, per-op and ONNX Runtime profiles -> `Profile`.

Nothing is written anywhere (storing profiles is the store's job); the only files are temporary ONNX exports.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph
from perfmodel.core.units import MS_PER_S
from perfmodel.graph.from_torch import capture_graph
from perfmodel.jobs.build import build_job
from perfmodel.jobs.onnx_export import export_onnx
from perfmodel.jobs.spec import JobSpec, OnnxSource
from perfmodel.profilers.env import capture_environment
from perfmodel.profilers.iteration import make_step, profile_iteration
from perfmodel.profilers.onnxrt import profile_onnx
from perfmodel.profilers.ops import profile_ops
from perfmodel.records import OnnxProfile, Outcome, Profile
from perfmodel.torch_device import resolve_device

Progress = Callable[[str], None]
# the graph IR to match a job's per-op profile against (None: none, the ops stay unmatched), e.g. a stored one
GraphFor = Callable[[JobSpec, Progress], Graph | None]

DEFAULT_TIME_BUDGET_S = 60.0
ITERATION_SHARE = 0.7  # of the budget left after the build, for the iteration profile; the rest for per-op
PROFILED_STEP_COST = 1.4  # a per-op step in plain steps: profiler on with shapes ~1.2, event parsing the rest


def profile_job(spec: JobSpec, device: str | torch.device = "cpu", *, warmup: int = 3, repeats: int = 10,
                per_op: bool = True, onnx: bool = False, op_steps: int = 3, progress: Progress | None = None,
                time_budget_s: float | None = DEFAULT_TIME_BUDGET_S, graph_for: GraphFor | None = None) -> Profile:
    """Profile `spec` on `device`.

    ONNX sources get only the ONNX Runtime profile. Other sources are built once, then: the iteration profile
    (`warmup` + `repeats` steps); if it ran (not out of memory) and `per_op`, the per-op profile over `op_steps`
    steps of the same, already warm, step function (no warm-up of its own), matched to the graph `graph_for(spec,
    progress)` gives (only then asked for; by default `capture_graph_or_none`, a fresh capture); if `onnx`, an ONNX
    export profiled with ONNX Runtime.

    `time_budget_s` is a soft bound on the iteration and per-op stages together (the ONNX stage is not in it), for
    models whose steps take seconds: `ITERATION_SHARE` of what is left after the build goes to the iteration profile
    (see `profile_iteration`: never fewer than 2 warm-up and 3 timed steps), and the per-op profile runs as many of
    its `op_steps` as fit in the rest (never fewer than 1). Steps of a second or less never feel it at the defaults;
    the counts actually run are in the profile (`iteration.warmup`, `iteration.repeats`, `ops.steps`), next to the
    coefficient of variation. None: always the requested counts.
    """
    deadline_s = None if time_budget_s is None else time.perf_counter() + time_budget_s
    say = progress or (lambda message: None)
    torch_device: torch.device = resolve_device(device)
    environment = capture_environment(torch_device)
    job_id = spec.key()
    if isinstance(spec.source, OnnxSource):
        say(f"profiling {spec.source.path} with ONNX Runtime")
        return Profile(job=spec, job_id=job_id, environment=environment, family="onnx",
                       onnx=_profile_onnx_file(spec.source.path, torch_device, spec))

    say(f"building {spec.name} (batch {spec.batch_size}) on {torch_device}")
    job = build_job(spec, torch_device)
    step = make_step(job)
    say(f"timing up to {warmup} warm-up + {repeats} steps")
    iteration = profile_iteration(job, warmup=warmup, repeats=repeats, step=step,
                                  time_budget_s=_left_s(deadline_s, share=ITERATION_SHARE))
    if iteration.outcome != Outcome.ok:
        say(f"out of memory: {iteration.error}")
        return Profile(job=spec, job_id=job_id, environment=environment, family=job.family, iteration=iteration)
    say(f"{iteration.warmup} warm-up + {iteration.repeats} timed steps: median "
        f"{iteration.iter_time_ms_median:.1f} ms, cv {iteration.iter_time_cv:.3f}")
    ops = None
    if per_op:
        assert iteration.iter_time_ms_median is not None  # set whenever the iteration profile ran
        graph = (graph_for or capture_graph_or_none)(spec, say)
        steps = _steps_that_fit(op_steps, _left_s(deadline_s), iteration.iter_time_ms_median * PROFILED_STEP_COST)
        say(f"profiling ops over {steps} step(s)")
        ops = profile_ops(job, graph, warmup=0, steps=steps, step=step)
        say(f"op coverage {ops.coverage:.2f}, matched to the IR {ops.matched_fraction:.2f}")
    family = job.family
    del job, step  # free the module before ONNX export and ORT build their own copies
    onnx_profile = _export_and_profile_onnx(spec, torch_device, say) if onnx else None
    return Profile(job=spec, job_id=job_id, environment=environment, family=family, iteration=iteration, ops=ops,
                   onnx=onnx_profile)


def _left_s(deadline_s: float | None, share: float = 1.0) -> float | None:
    return None if deadline_s is None else share * max(0.0, deadline_s - time.perf_counter())


def _steps_that_fit(wanted: int, left_s: float | None, step_ms: float) -> int:
    if left_s is None:
        return wanted
    return max(1, min(wanted, int(left_s * MS_PER_S // step_ms)))


def capture_graph_or_none(spec: JobSpec, say: Progress) -> Graph | None:
    """The job's IR for op matching; None (ops stay unmatched, matched_fraction 0) when torch.export fails on the
    model: the measured op times are still worth keeping."""
    say("capturing the graph (torch.export on meta)")
    try:
        return capture_graph(spec)
    except PerfmodelError as exc:  # capture_graph reports every torch.export failure as one
        say(f"graph capture failed, ops will not be matched to IR nodes: {exc}")
        return None


def _export_and_profile_onnx(spec: JobSpec, device: torch.device, say: Progress) -> OnnxProfile | None:
    """The ORT profile of the job's ONNX export; None when the model cannot be exported (the PyTorch profiles
    already taken are kept)."""
    with tempfile.TemporaryDirectory(prefix="perfmodel-onnx-") as tmp:
        say("exporting to ONNX")
        try:
            path = export_onnx(spec, Path(tmp) / "model.onnx")
        except PerfmodelError as exc:  # export_onnx reports every exporter failure as one
            say(f"ONNX export failed, no ONNX Runtime profile: {exc}")
            return None
        say("profiling the ONNX export with ONNX Runtime")
        return _profile_onnx_file(path, device, spec)


def _profile_onnx_file(path: str | Path, device: torch.device, spec: JobSpec) -> OnnxProfile:
    return profile_onnx(path, device, batch_size=spec.batch_size, seq_len=spec.seq_len)

"""`perfmodel profile`: profile one job (or a sweep file of jobs) for real on this host's device and add it to the
store, or fan the jobs out as Ray tasks (`--ray`) that store their own results; the work is
perfmodel/store/profiling.py's."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from perfmodel.cli.common import (
    BatchOpt,
    ChannelsLastOpt,
    FusedOptimizerOpt,
    HFConfigOpt,
    JsonOpt,
    ModelArg,
    ModeOpt,
    ModuleOpt,
    OnnxOpt,
    OptimizerOpt,
    PrecisionOpt,
    SeqOpt,
    StoreOpt,
    TaskOpt,
    err,
    job_spec,
    out,
    print_json,
    say,
    user_errors,
)
from perfmodel.core.errors import PerfmodelError


@user_errors
def profile(model: ModelArg = None, hf_config: HFConfigOpt = None, task: TaskOpt = None,
            module: ModuleOpt = None, onnx: OnnxOpt = None, batch_size: BatchOpt = 1, seq_len: SeqOpt = None,
            precision: PrecisionOpt = "fp32", optimizer: OptimizerOpt = None, mode: ModeOpt = "train",
            channels_last: ChannelsLastOpt = False, fused_optimizer: FusedOptimizerOpt = False,
            device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N (ROCm too)")] = "cpu",
            warmup: Annotated[int, typer.Option(min=0, help="untimed steps first")] = 3,
            repeats: Annotated[int, typer.Option(min=1, help="timed steps")] = 10,
            per_op: Annotated[bool, typer.Option("--per-op/--no-per-op", help="torch.profiler per-op")] = True,
            onnxrt: Annotated[bool, typer.Option("--onnxrt/--no-onnxrt",
                                                 help="also export to ONNX and profile in ONNX Runtime")] = False,
            time_budget: Annotated[float, typer.Option(
                min=0, help="soft seconds per job; slow models get fewer steps (never < 2 warm-up, 3 timed); "
                            "0: always the full counts")] = 60.0,
            sweep: Annotated[Optional[Path], typer.Option(help="YAML/JSON file of jobs (see docs/jobs.md)")] = None,
            force: Annotated[bool, typer.Option(help="profile even what the store already has")] = False,
            ray: Annotated[Optional[str], typer.Option(
                "--ray", metavar="ADDRESS", help="run each job as a Ray task (pip install 'perfmodel\\[ray]'): "
                "`local` starts Ray here, `auto` joins the running cluster, or HOST:PORT; results go to --store "
                "(PostgreSQL on a cluster)")] = None,
            store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Profile one job (or a sweep file of jobs) for real and add it to the store.

    A sweep is resumable: jobs the store already has on this device are skipped (unless --force)."""
    from perfmodel.store import ProfileStore
    from perfmodel.store.profiling import profile_into_store, profile_on_ray

    options = dict(warmup=warmup, repeats=repeats, per_op=per_op, onnx=onnxrt, time_budget_s=time_budget or None)
    if ray is None:  # on Ray workers the device is theirs, not this host's
        from perfmodel.torch_device import resolve_device

        resolve_device(device)  # fail fast, before any work
    if sweep is not None and (model or hf_config or module or onnx):
        raise PerfmodelError("give either a job or --sweep, not both")
    from perfmodel.jobs.sweep import check_source, load_sweep

    if sweep is not None:
        specs = load_sweep(sweep)  # every job checked, its model source resolved, before the first runs
    else:
        specs = [job_spec(model, hf_config, task, module, onnx, batch_size, seq_len, precision, optimizer, mode,
                          channels_last=channels_last, fused_optimizer=fused_optimizer)]
        check_source(specs[0])  # a missing file or unknown name is one line, before any progress line
    if ray is not None:
        on_ray = profile_on_ray(specs, device, ray, store, force=force, progress=say, options=options)
        if as_json:
            print_json(on_ray)
        for r in [] if as_json else on_ray:
            out.print(json.dumps(r), highlight=False)
        raise typer.Exit(1 if any("error" in r for r in on_ray) else 0)

    from perfmodel.cli.render import profile_as_json, render_profile

    single = len(specs) == 1
    results: list[dict[str, Any]] = []
    with ProfileStore(store) as profile_store, _progress(len(specs), enabled=not single and not as_json) as advance:
        for job in profile_into_store(specs, device, profile_store, force=force, stop_on_error=single,
                                      progress=say if single and not as_json else None, **options):
            spec = job.spec
            if job.skipped:
                advance(f"skip {spec.name} (in store)")
                results.append({"job_name": spec.name, "job_id": spec.key(), "skipped": True})
            elif job.error is not None:
                typer.echo(f"error: {spec.name}: {job.error}", err=True)
                results.append({"job_name": spec.name, "job_id": spec.key(), "error": job.error})
                advance(f"failed {spec.name}")
            else:
                advance(f"{spec.name} b={spec.batch_size}")
                if as_json:
                    results.append({"profile_id": job.profile_id, **profile_as_json(job.profile)})
                else:
                    render_profile(out, job.profile, job.profile_id)
    if as_json:
        print_json(results if sweep is not None else results[0])
    if any("error" in r for r in results):
        raise typer.Exit(1)


class _progress:
    """A rich progress bar over a sweep (a no-op for a single job)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled

    def __enter__(self) -> Callable[[str], None]:
        if not self.enabled:
            return lambda _msg: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=err)
        self.bar.start()
        task = self.bar.add_task("profiling", total=self.total)
        return lambda msg: self.bar.update(task, advance=1, description=msg)

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.bar.stop()

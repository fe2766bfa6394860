"""The `perfmodel` command line (typer). Every user error is one line on stderr and exit code 2."""

from __future__ import annotations

import functools
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console

from perfmodel.core.errors import PerfmodelError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="perfmodel: what throughput will job X reach on placement Y?")
zoo_app = typer.Typer(no_args_is_help=True, help="The model zoo (architectures built from code, no weights).")
profiles_app = typer.Typer(no_args_is_help=True, help="Profiles in the store: list, show, export, import.")
hw_app = typer.Typer(no_args_is_help=True, help="The hardware catalog: list, show, probe this host.")
models_app = typer.Typer(no_args_is_help=True, help="Trained models in the registry: list, promote.")
app.add_typer(zoo_app, name="zoo")
app.add_typer(profiles_app, name="profiles")
app.add_typer(hw_app, name="hw")
app.add_typer(models_app, name="models")

# Piped output (scripts, CI logs) gets a wide console rather than rich's 80-column default.
out = Console(soft_wrap=True, width=shutil.get_terminal_size((160, 24)).columns)
err = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn bad input into a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from perfmodel.jobs.sweep import format_validation_error

        try:
            return fn(*args, **kwargs)
        except PerfmodelError as exc:
            message = str(exc)
        except ValidationError as exc:
            message = format_validation_error(exc)
        typer.echo("error: " + " ".join(message.split()), err=True)
        raise typer.Exit(2)

    return wrapper  # type: ignore[return-value]


# --- job options, shared by every command that takes a job ----------------------------------------------------
ModelArg = Annotated[Optional[str], typer.Argument(help="zoo model name (see `perfmodel zoo list`)")]
HFConfigOpt = Annotated[Optional[Path], typer.Option("--hf-config", help="HF config.json (or its folder)")]
TaskOpt = Annotated[Optional[str], typer.Option(help="HF head: base, causal-lm, masked-lm, seq2seq-lm, "
                                                     "sequence-classification, question-answering")]
ModuleOpt = Annotated[Optional[str], typer.Option("--module", help="path/to/file.py:NAME")]
OnnxOpt = Annotated[Optional[Path], typer.Option("--onnx", help="an .onnx file")]
BatchOpt = Annotated[int, typer.Option("--batch-size", "-b", help="batch size")]
SeqOpt = Annotated[Optional[int], typer.Option("--seq-len", help="sequence length of token models [128]")]
PrecisionOpt = Annotated[str, typer.Option(help="fp32 (PyTorch's defaults: TF32 convs on Ampere+), fp32-strict, "
                                                "tf32, amp, amp-bf16, fp16 or bf16")]
OptimizerOpt = Annotated[str, typer.Option(help="sgd (momentum 0.9), adam or adamw")]
ModeOpt = Annotated[str, typer.Option(help="train or inference")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
StoreOpt = Annotated[Optional[str], typer.Option("--store", help="store URL [env PERFMODEL_STORE_URL, "
                                                                   "default SQLite under PERFMODEL_HOME]")]


def job_spec(model: str | None, hf_config: Path | None, task: str | None, module: str | None,
             onnx: Path | None, batch_size: int, seq_len: int | None, precision: str, optimizer: str,
             mode: str) -> Any:
    from perfmodel.jobs.spec import JobSpec

    if onnx is not None and not onnx.is_file():
        raise PerfmodelError(f"ONNX file not found: {onnx}")
    return JobSpec.from_options(zoo=model, hf_config=hf_config, task=task, module=module,
                                onnx=str(onnx) if onnx else None, batch_size=batch_size, seq_len=seq_len,
                                precision=precision, optimizer=optimizer, mode=mode)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


# --- zoo ----------------------------------------------------------------------------------------------------------
@zoo_app.command("list")
def zoo_list(as_json: JsonOpt = False) -> None:
    """List the zoo's models with their family and library."""
    from rich.table import Table

    from perfmodel.jobs.zoo import ZOO

    rows = [{"name": e.name, "family": e.family, "library": e.library, "inputs": e.inputs.value}
            for e in ZOO.values()]
    if as_json:
        print_json(rows)
        return
    table = Table("name", "family", "library", "inputs", title=f"{len(rows)} zoo models")
    for r in rows:
        table.add_row(*r.values())
    out.print(table)


# --- graph --------------------------------------------------------------------------------------------------------
@app.command()
@user_errors
def graph(model: ModelArg = None, hf_config: HFConfigOpt = None, task: TaskOpt = None, module: ModuleOpt = None,
          onnx: OnnxOpt = None, batch_size: BatchOpt = 1, seq_len: SeqOpt = None, precision: PrecisionOpt = "fp32",
          optimizer: OptimizerOpt = "sgd", mode: ModeOpt = "train", as_json: JsonOpt = False) -> None:
    """Capture a job's graph (no weights allocated) and summarise it; --json prints the IR."""
    from perfmodel.graph import graph_for_job

    spec = job_spec(model, hf_config, task, module, onnx, batch_size, seq_len, precision, optimizer, mode)
    g = graph_for_job(spec)
    if as_json:
        sys.stdout.write(g.to_json() + "\n")
        return
    from perfmodel.cli.render import render_graph_summary

    render_graph_summary(out, g)


# --- profile ------------------------------------------------------------------------------------------------------
@app.command()
@user_errors
def profile(model: ModelArg = None, hf_config: HFConfigOpt = None, task: TaskOpt = None,
            module: ModuleOpt = None, onnx: OnnxOpt = None, batch_size: BatchOpt = 1, seq_len: SeqOpt = None,
            precision: PrecisionOpt = "fp32", optimizer: OptimizerOpt = "sgd", mode: ModeOpt = "train",
            device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N (ROCm too)")] = "cpu",
            warmup: Annotated[int, typer.Option(min=0, help="untimed steps first")] = 3,
            repeats: Annotated[int, typer.Option(min=1, help="timed steps")] = 10,
            per_op: Annotated[bool, typer.Option("--per-op/--no-per-op", help="torch.profiler per-op")] = True,
            onnxrt: Annotated[bool, typer.Option("--onnxrt/--no-onnxrt",
                                                 help="also export to ONNX and profile in ONNX Runtime")] = False,
            time_budget: Annotated[float, typer.Option(
                min=0, help="soft seconds per job; slow models get fewer steps (never < 2 warm-up, 3 timed); "
                            "0: always the full counts")] = 60.0,
            sweep: Annotated[Optional[Path], typer.Option(help="YAML/JSON file of jobs (see README)")] = None,
            force: Annotated[bool, typer.Option(help="profile even what the store already has")] = False,
            ray: Annotated[Optional[str], typer.Option(
                "--ray", metavar="ADDRESS", help="run each job as a Ray task (pip install 'perfmodel\\[ray]'): "
                "`local` starts Ray here, `auto` joins the running cluster, or HOST:PORT; results go to --store "
                "(PostgreSQL on a cluster)")] = None,
            store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Profile one job (or a sweep file of jobs) for real and add it to the store.

    A sweep is resumable: jobs the store already has on this device are skipped (unless --force)."""
    from perfmodel.device import resolve_device
    from perfmodel.profilers.run import profile_job
    from perfmodel.store import ProfileStore

    if ray is not None:  # the jobs run on Ray workers: the device is theirs, not this host's
        from perfmodel.cli.profile_ray import profile_specs_on_ray

        if sweep is not None and (model or hf_config or module or onnx):
            raise PerfmodelError("give either a job or --sweep, not both")
        specs = load_sweep_specs(sweep) if sweep is not None else [
            job_spec(model, hf_config, task, module, onnx, batch_size, seq_len, precision, optimizer, mode)]
        results = profile_specs_on_ray(specs, device, ray, store, force=force, progress=_say, options=dict(
            warmup=warmup, repeats=repeats, per_op=per_op, onnx=onnxrt, time_budget_s=time_budget or None))
        if as_json:
            print_json(results)
        for r in [] if as_json else results:
            out.print(json.dumps(r), highlight=False)
        raise typer.Exit(1 if any("error" in r for r in results) else 0)
    resolve_device(device)  # fail fast, before any work
    if sweep is not None:
        from perfmodel.jobs.sweep import load_sweep

        if model or hf_config or module or onnx:
            raise PerfmodelError("give either a job or --sweep, not both")
        specs, _ = load_sweep(sweep)
    else:
        specs = [job_spec(model, hf_config, task, module, onnx, batch_size, seq_len, precision, optimizer, mode)]

    from perfmodel.cli.render import profile_as_json, render_profile
    from perfmodel.profilers.env import capture_environment

    results = []
    with ProfileStore(store) as profile_store:
        device_name = capture_environment(resolve_device(device)).device_name
        with _progress(len(specs), enabled=len(specs) > 1 and not as_json) as advance:
            for spec in specs:
                if not force and profile_store.has(spec.key(), device_name=device_name):
                    advance(f"skip {spec.name} (in store)")
                    results.append({"job": spec.name, "job_key": spec.key(), "skipped": True})
                    continue
                try:
                    prof = profile_job(spec, device, warmup=warmup, repeats=repeats, per_op=per_op, onnx=onnxrt,
                                       time_budget_s=time_budget or None,
                                       progress=_say if len(specs) == 1 and not as_json else None)
                except PerfmodelError as exc:
                    if len(specs) == 1:
                        raise
                    typer.echo(f"error: {spec.name}: {exc}", err=True)
                    results.append({"job": spec.name, "job_key": spec.key(), "error": str(exc)})
                    advance(f"failed {spec.name}")
                    continue
                profile_id = profile_store.add(prof)
                advance(f"{spec.name} b={spec.batch_size}")
                if as_json:
                    results.append({"profile_id": profile_id, **profile_as_json(prof)})
                else:
                    render_profile(out, prof, profile_id)
    if as_json:
        print_json(results if sweep is not None else results[0])
    if any("error" in r for r in results):
        raise typer.Exit(1)


def load_sweep_specs(sweep: Path) -> list:
    from perfmodel.jobs.sweep import load_sweep

    return load_sweep(sweep)[0]


def _say(message: str) -> None:
    err.print(f"[dim]{message}[/]", highlight=False)


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


# --- profiles -----------------------------------------------------------------------------------------------------
@profiles_app.command("list")
@user_errors
def profiles_list(job: Annotated[Optional[str], typer.Option(help="job name")] = None,
                  device: Annotated[Optional[str], typer.Option(help="device name")] = None,
                  limit: Annotated[Optional[int], typer.Option(min=1)] = None,
                  store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """List stored profiles, newest first."""
    from perfmodel.cli.render import render_profile_list
    from perfmodel.store import ProfileStore

    with ProfileStore(store) as profile_store:
        rows = profile_store.list(job=job, device=device, limit=limit)
    if as_json:
        print_json([r.model_dump(mode="json") if hasattr(r, "model_dump") else r.__dict__ for r in rows])
    else:
        render_profile_list(out, rows)


@profiles_app.command("show")
@user_errors
def profiles_show(profile_id: Annotated[int, typer.Argument(help="profile id (see `profiles list`)")],
                  top: Annotated[int, typer.Option(help="ops to show")] = 15,
                  store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Show one stored profile: iteration statistics, environment, top ops."""
    from perfmodel.cli.render import render_profile
    from perfmodel.store import ProfileStore

    with ProfileStore(store) as profile_store:
        prof = profile_store.get(profile_id)
    if as_json:
        sys.stdout.write(prof.model_dump_json(indent=2) + "\n")
    else:
        render_profile(out, prof, profile_id, top=top)


@profiles_app.command("export")
@user_errors
def profiles_export(directory: Annotated[Path, typer.Argument(help="folder to write Parquet files to")],
                    store: StoreOpt = None) -> None:
    """Export every stored profile to Parquet (for shipping under profiles/)."""
    from perfmodel.store import ProfileStore

    with ProfileStore(store) as profile_store:
        counts = profile_store.export_parquet(directory)
    out.print(", ".join(f"{n} {table}" for table, n in counts.items()) + f" -> {directory}")


@profiles_app.command("import")
@user_errors
def profiles_import(directory: Annotated[Path, typer.Argument(help="folder holding an export")],
                    store: StoreOpt = None) -> None:
    """Import profiles from a Parquet export; profiles the store already has are skipped."""
    from perfmodel.store import ProfileStore

    with ProfileStore(store) as profile_store:
        added = profile_store.import_parquet(directory)
    out.print(f"imported {added} new profile(s) from {directory}")


@profiles_app.command("ops-summary")
@user_errors
def profiles_ops_summary(source: Annotated[Optional[str], typer.Option(
                             help="neusight, vidur, deepbench, llmservingsim or phantora")] = None,
                         store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Count the imported op measurements (`perfmodel import`) per source, device, op class and dtype."""
    from perfmodel.cli.render import render_measurement_counts
    from perfmodel.store import ProfileStore

    with ProfileStore(store) as profile_store:
        counts = profile_store.op_measurement_counts(by=("source", "device", "op_class", "dtype"), source=source)
    if as_json:
        print_json([{"source": s, "device": d, "op_class": c, "dtype": t, "records": n} for s, d, c, t, n in counts])
    else:
        render_measurement_counts(out, counts)


# --- import public measurements ------------------------------------------------------------------------------------
@app.command("import")
@user_errors
def import_dataset(
        source: Annotated[str, typer.Argument(help="the dataset: neusight, vidur, deepbench, llmservingsim "
                                                   "or phantora")],
        path: Annotated[Path, typer.Argument(help="its folder, e.g. ../shared/datasets/neusight (read in place)")],
        replace: Annotated[bool, typer.Option(help="first drop what the store holds from the files read "
                                                   "(after a change in how they are mapped)")] = False,
        store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Import a public dataset of GPU op measurements into the store, per op and device.

    Devices are matched to the hardware catalog (`perfmodel hw list`); rows of devices it lacks are skipped and
    counted. Importing a dataset again adds only what the store does not have."""
    import time

    from perfmodel.cli.render import import_as_json, render_import
    from perfmodel.importers import ImportStats, get_importer
    from perfmodel.store import ProfileStore

    importer = get_importer(source)
    stats = ImportStats()
    started = time.perf_counter()
    records = importer(path, stats=stats)  # checks the folder now: a bad path fails before the store is opened
    if not as_json:
        records = _announce_files(records, stats)
    with ProfileStore(store) as profile_store:
        added = profile_store.add_op_measurements(records, replace=replace)
    summary = import_as_json(source.strip().lower(), str(path), stats, added, time.perf_counter() - started)
    if as_json:
        print_json(summary)
    else:
        render_import(out, summary)


def _announce_files(records: Any, stats: Any) -> Any:
    """`records`, saying on stderr which file is being read as each is started."""
    announced = 0
    for record in records:
        while announced < len(stats.files):
            _say(f"reading {stats.files[announced]}")
            announced += 1
        yield record
    for name in stats.files[announced:]:
        _say(f"read {name}")


# --- hardware -------------------------------------------------------------------------------------------------------
@hw_app.command("list")
@user_errors
def hw_list(as_json: JsonOpt = False) -> None:
    """List the catalog's accelerators."""
    from rich.table import Table

    from perfmodel.hardware.catalog import load_catalog

    entries = sorted(load_catalog().values(), key=lambda e: (e.kind, e.vendor, e.release_year or 0, e.name))
    if as_json:
        print_json([e.model_dump(mode="json") for e in entries])
        return

    def tflops(gflops: float | None) -> str:
        return "-" if gflops is None else f"{gflops / 1000:.3g}" if gflops < 10_000 else f"{gflops / 1000:.0f}"

    table = Table("id", "kind", "vendor", "fp32 TFLOP/s", "fp16 TFLOP/s", "memory GB", "bandwidth GB/s",
                  title=f"{len(entries)} accelerators (`perfmodel hw show ID` for every field)")
    for e in entries:
        table.add_row(e.name, e.kind, e.vendor, tflops(e.peak_fp32_gflops), tflops(e.peak_fp16_gflops),
                      f"{e.memory_gb:g}", f"{e.memory_bandwidth_gbps:.0f}")
    out.print(table)


@hw_app.command("show")
@user_errors
def hw_show(name: Annotated[str, typer.Argument(help="catalog name or alias")]) -> None:
    """Show one accelerator (any alias resolves)."""
    from perfmodel.hardware.catalog import get_accelerator

    print_json(get_accelerator(name).model_dump(mode="json"))


from perfmodel.cli import hw_bench as _hw_bench  # noqa: E402  `hw bench` and `adapt` (their own module)

_hw_bench.register(hw_app, app, user_errors)
from perfmodel.cli import hw_add as _hw_add  # noqa: E402  `hw add` (custom accelerators, its own module)

_hw_add.register(hw_app, user_errors)


@hw_app.command("probe")
@user_errors
def hw_probe(save: Annotated[bool, typer.Option(help="record it as catalog entry `cpu` (in PERFMODEL_HOME)")] = False,
             as_json: JsonOpt = False) -> None:
    """Measure this host: cores, threads, GEMM GFLOP/s, copy GB/s."""
    from perfmodel.hardware.catalog import save_local
    from perfmodel.hardware.probe import probe_host

    spec = probe_host()
    if save:
        save_local(spec)
    if as_json:
        print_json(spec.model_dump(mode="json"))
    else:
        model = spec.aliases[0] if spec.aliases else "unnamed CPU"
        out.print(f"{spec.name}: {model} ({spec.vendor or 'unknown vendor'}), {spec.compute_units} cores, "
                  f"{spec.threads} threads, "
                  f"{spec.peak_fp32_gflops:.1f} GFLOP/s fp32 GEMM, {spec.memory_bandwidth_gbps:.1f} GB/s copy, "
                  f"{spec.memory_gb:.1f} GB" + (" (saved)" if save else ""))


# --- learning: train, evaluate, models -----------------------------------------------------------------------------
ProfilesDirOpt = Annotated[Optional[Path], typer.Option(
    "--profiles", help="a Parquet export to learn from [profiles/cpu-corpus]; --store reads a store instead")]


def _training_samples(profiles: Path | None, store: str | None) -> list:
    from perfmodel.features.dataset import samples_from_store
    from perfmodel.store import ProfileStore

    if store is not None:
        with ProfileStore(store) as profile_store:
            return samples_from_store(profile_store, progress=_say)
    from perfmodel.registry.registry import default_models_dir

    directory = profiles or default_models_dir().parent / "profiles" / "cpu-corpus"
    with ProfileStore("sqlite://") as memory_store:  # an in-memory store of the export
        memory_store.import_parquet(directory)
        return samples_from_store(memory_store, progress=_say)


def _with_seed(cls: type, seed: int) -> Callable[[], Any]:
    """A factory passing `seed` to regressors that take one (the roofline baseline learns nothing)."""
    import inspect

    takes_seed = "seed" in inspect.signature(cls).parameters
    return functools.partial(cls, seed=seed) if takes_seed else cls


@app.command()
@user_errors
def train(regressor: Annotated[str, typer.Option(help="roofline, xgb-ops, xgb-graph or gnn")] = "xgb-ops",
          name: Annotated[Optional[str], typer.Option(help="registry name [the regressor's]")] = None,
          promote: Annotated[bool, typer.Option(help="make it the default model")] = False,
          seed: Annotated[int, typer.Option(help="random seed")] = 0,
          profiles: ProfilesDirOpt = None, store: StoreOpt = None) -> None:
    """Train a regressor on the profile corpus and save it to the registry (seeded, reproducible)."""
    from perfmodel.registry.registry import ModelRegistry, training_domain
    from perfmodel.regressors import regressor_class

    cls = regressor_class(regressor, iteration=True)
    samples = _training_samples(profiles, store)
    if not samples:
        raise PerfmodelError("no usable profiles to train on (need outcome ok with a per-op profile)")
    _say(f"training {regressor} on {len(samples)} profiles")
    fitted = _with_seed(cls, seed)().fit(samples)
    registry = ModelRegistry()
    entry = registry.save(fitted, name or regressor, training_domain(samples))
    if promote:
        registry.promote(entry.ref)
    out.print(f"saved {entry.ref} ({entry.path})" + (" and promoted it" if promote else ""))


@app.command("train-ops")
@user_errors
def train_ops(store: StoreOpt = None,
              sources: Annotated[str, typer.Option(help="comma-separated import sources to learn from")] =
              "neusight,vidur,deepbench,llmservingsim,phantora",
              name: Annotated[str, typer.Option(help="registry name")] = "xgb-device-ops",
              promote: Annotated[bool, typer.Option(help="make it the promoted device-ops model")] = False,
              seed: Annotated[int, typer.Option(help="random seed")] = 0) -> None:
    """Train the per-op device regressor (xgb-device-ops) on imported GPU measurements (`perfmodel import`)."""
    from perfmodel.evaluation.device_ops import training_rows
    from perfmodel.features.device_ops import OP_CLASSES
    from perfmodel.hardware.catalog import load_catalog
    from perfmodel.registry.registry import ModelRegistry
    from perfmodel.regressors.device_ops import DeviceOpRegressor
    from perfmodel.store import ProfileStore

    with ProfileStore(store) as profile_store:
        measured = profile_store.op_measurements(source=sources.split(","), extra=False)
    ops = training_rows(measured)
    ops = ops[ops["op_class"].isin(OP_CLASSES)]
    if ops.empty:
        raise PerfmodelError(f"the store has no op measurements of {sources}: run `perfmodel import SOURCE PATH` "
                             "first")
    _say(f"training xgb-device-ops on {len(ops)} rows of {ops['device'].nunique()} devices")
    fitted = DeviceOpRegressor(seed=seed).fit(ops, load_catalog())
    registry = ModelRegistry()
    domain = {"devices": sorted(set(ops["device"])), "sources": sources.split(","),
              "dtypes": sorted(set(ops["dtype"])), "op_classes": sorted(set(ops["op_class"]))}
    entry = registry.save(fitted, name, domain)
    if promote:
        registry.promote(entry.ref, role="device-ops")
    out.print(f"saved {entry.ref} ({entry.path})" + (" and promoted it for device-ops" if promote else ""))


@app.command()
@user_errors
def evaluate(regressors: Annotated[str, typer.Option(help="comma-separated")] = "roofline,xgb-ops,xgb-graph,gnn",
             folds: Annotated[int, typer.Option("-k", "--folds", min=2, help="family folds")] = 5,
             output: Annotated[Path, typer.Option(help="report folder")] = Path("reports"),
             seed: Annotated[int, typer.Option(help="random seed")] = 0,
             profiles: ProfilesDirOpt = None, store: StoreOpt = None) -> None:
    """k-fold by model family (a family is never in both train and test): MAPE, median and p90 APE per family
    and regressor, 80 % interval coverage; writes report.md and PNG plots."""
    from perfmodel.evaluation import evaluate as run_evaluation
    from perfmodel.evaluation import write_report
    from perfmodel.regressors import regressor_class

    names = [n.strip() for n in regressors.split(",") if n.strip()]
    factories = {n: _with_seed(regressor_class(n, iteration=True), seed) for n in names}
    samples = _training_samples(profiles, store)
    result = run_evaluation(factories, samples, k=folds, seed=seed)
    paths = write_report(result, output)
    sys.stdout.write(paths["report"].read_text())
    out.print(f"[dim]report, predictions and plots in {output}/[/]")


@models_app.command("list")
@user_errors
def models_list(as_json: JsonOpt = False) -> None:
    """List registered models (* marks the promoted default)."""
    from rich.table import Table

    from perfmodel.registry.registry import ModelRegistry

    entries = ModelRegistry().entries()
    rows = [{"model": e.ref, "regressor": e.manifest.regressor, "promoted": e.promoted,
             "samples": e.manifest.training_samples, "created_at": e.manifest.created_at.isoformat(),
             "metrics": e.manifest.metrics} for e in entries]
    if as_json:
        print_json(rows)
        return
    table = Table("model", "regressor", "samples", "created (UTC)", title=f"{len(rows)} models")
    for e in entries:
        table.add_row(("* " if e.promoted else "  ") + e.ref, e.manifest.regressor, str(e.manifest.training_samples),
                      e.manifest.created_at.isoformat()[:16])
    out.print(table)


@models_app.command("promote")
@user_errors
def models_promote(ref: Annotated[str, typer.Argument(help="NAME/VERSION (or NAME: its newest)")]) -> None:
    """Make a model the default; one whose artifact does not load is refused."""
    from perfmodel.registry.registry import ModelRegistry

    entry = ModelRegistry().promote(ref)
    out.print(f"promoted {entry.ref}")


# --- predict ---------------------------------------------------------------------------------------------------------
@app.command()
@user_errors
def predict(model: ModelArg = None, hf_config: HFConfigOpt = None, task: TaskOpt = None, module: ModuleOpt = None,
            onnx: OnnxOpt = None,
            batch_size: Annotated[int, typer.Option(
                "--batch-size", "-b", help="samples in one forward/backward pass of one model replica (README, "
                                           "\"Batch size\")")] = 1,
            global_batch_size: Annotated[Optional[int], typer.Option(
                help="samples per iteration over all replicas and micro-batches [--batch-size x data-parallel "
                     "degree x --micro-batches]")] = None,
            seq_len: SeqOpt = None, precision: PrecisionOpt = "fp32", optimizer: OptimizerOpt = "sgd",
            mode: ModeOpt = "train",
            accelerator: Annotated[str, typer.Option(help="catalog name or alias (`perfmodel hw list`)")] = "cpu",
            nodes: Annotated[int, typer.Option(help="nodes (with --per-node devices each)")] = 1,
            per_node: Annotated[int, typer.Option(help="devices per node")] = 1,
            devices_per_node: Annotated[Optional[str], typer.Option(
                help="uneven layout instead of --nodes/--per-node, e.g. 4,4,2")] = None,
            tp: Annotated[int, typer.Option(help="tensor-parallel degree")] = 1,
            pp: Annotated[int, typer.Option(help="pipeline stages")] = 1,
            micro_batches: Annotated[int, typer.Option(help="micro-batches per replica per iteration")] = 1,
            zero: Annotated[int, typer.Option(help="ZeRO stage 0-3 (3 = FSDP)")] = 0,
            checkpointing: Annotated[bool, typer.Option(help="activation checkpointing")] = False,
            intra_link: Annotated[Optional[str], typer.Option(
                help="override the catalog's intra-node link: nvlink1..5, infinity-fabric, pcie3..5")] = None,
            ep: Annotated[int, typer.Option(help="expert-parallel degree (mixture of experts; divides the "
                                                 "data-parallel degree)")] = 1,
            inter_node_gbps: Annotated[Optional[float], typer.Option(
                help="network of one node over all its NICs, Gb/s [the catalog's node_network_gbit_s, else "
                     "100]")] = None,
            inter_node_latency_us: Annotated[float, typer.Option(help="network latency, us")] = 5.0,
            model_version: Annotated[Optional[str], typer.Option(help="NAME/VERSION [the promoted models]")] = None,
            as_json: JsonOpt = False) -> None:
    """Predict a job's iteration time, throughput and per-device memory on a placement from its graph alone
    (nothing is run). Compute per device comes from the per-op device model on a GPU (any catalog GPU, from its
    spec sheet) or the iteration model on the profiled CPU; the placement model adds communication, the pipeline
    bubble and the memory of each device's shard. `--batch-size` is the job's batch (one replica's forward/backward
    pass); the placement runs `--global-batch-size` samples per iteration, by default that batch on every
    data-parallel replica and micro-batch."""
    from perfmodel.engine import EngineConfig, PredictionEngine

    spec = job_spec(model, hf_config, task, module, onnx, batch_size, seq_len, precision, optimizer, mode)
    placement = placement_spec(accelerator, global_batch_size, batch_size=batch_size, nodes=nodes,
                               per_node=per_node, devices_per_node=devices_per_node, tp=tp, pp=pp,
                               micro_batches=micro_batches, zero=zero, checkpointing=checkpointing,
                               intra_link=intra_link, ep=ep, inter_node_gbps=inter_node_gbps,
                               inter_node_latency_us=inter_node_latency_us)
    engine = PredictionEngine.open(EngineConfig(model_version=model_version, isolate_captures=False))
    result = engine.prediction(spec, placement)
    if as_json:
        print_json(result.model_dump(mode="json"))
        return
    lo, hi = result.interval_ms
    layout = "+".join(str(n) for n in placement.devices_per_node)
    out.print(f"[bold]{result.job}[/] b={placement.global_batch_size} {spec.mode.value} on {layout} x "
              f"{result.accelerator}: {result.iteration_time_ms:.2f} ms/iteration (80 % interval {lo:.2f}-{hi:.2f}), "
              f"{result.throughput_samples_per_s:.1f} samples/s  [dim]{result.model_version}[/]")
    out.print("  " + ", ".join(f"{k} {v:.2f} ms" for k, v in result.breakdown_ms.items()))
    fits = "fits" if result.fits else "[red]does not fit[/]"
    out.print(f"  peak memory per device ~{result.peak_memory_bytes / 2**30:.2f} GiB of "
              f"{(result.memory_capacity_bytes or 0) / 2**30:.1f} GiB usable: {fits}")
    if result.extrapolated:
        out.print("  [yellow]extrapolated:[/] " + "; ".join(result.extrapolation_reasons))


def placement_spec(accelerator: str, global_batch_size: int | None, *, batch_size: int = 1, nodes: int = 1,
                   per_node: int = 1, devices_per_node: str | None = None, tp: int = 1, pp: int = 1,
                   micro_batches: int = 1, zero: int = 0, checkpointing: bool = False, intra_link: str | None = None,
                   ep: int = 1, inter_node_gbps: float | None = None, inter_node_latency_us: float = 5.0) -> Any:
    """A PlacementSpec from CLI options: data parallel over whatever the tensor and pipeline degrees leave.
    `global_batch_size` None: `batch_size` on every data-parallel replica and micro-batch. `inter_node_gbps`
    None: the catalog's network of the accelerator's server."""
    from perfmodel.placement.spec import Parallelism, PlacementSpec

    if devices_per_node:
        try:
            layout = tuple(int(n) for n in devices_per_node.split(","))
        except ValueError:
            raise PerfmodelError(
                f"--devices-per-node: expected integers like 4,4,2, got {devices_per_node!r}") from None
    else:
        layout = (per_node,) * nodes
    devices = sum(layout)
    if devices % (tp * pp):
        raise PerfmodelError(f"--tp {tp} x --pp {pp} does not divide the {devices} devices")
    data = devices // (tp * pp)
    if ep < 1 or data % ep:
        raise PerfmodelError(f"--ep {ep} does not divide the data-parallel degree {data}")
    # validated from what the user typed: pydantic names a --zero or --intra-link outside its choices
    parallelism = Parallelism.model_validate(dict(
        data=data, tensor=tp, pipeline=pp, micro_batches=micro_batches, expert=ep, zero_stage=zero,
        activation_checkpointing=checkpointing))
    if global_batch_size is None:
        global_batch_size = batch_size * data * micro_batches
    return PlacementSpec.model_validate(dict(
        accelerator=accelerator, devices_per_node=layout, intra_node_link=intra_link,
        inter_node_bandwidth_gbps=inter_node_gbps, inter_node_latency_us=inter_node_latency_us,
        parallelism=parallelism, global_batch_size=global_batch_size))


PREDICTION_COLUMNS = ("predicted_ms", "p10_ms", "p90_ms", "extrapolated")
_COMPRESSION = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zip": "zip", ".zst": "zstd"}


def _device_ops_model(ref: str | None) -> tuple[Any, str]:
    """The xgb-device-ops regressor `ref` names (NAME/VERSION or NAME), or the one promoted for `device-ops`."""
    from perfmodel.registry.registry import ModelRegistry
    from perfmodel.regressors import load_regressor

    registry = ModelRegistry()
    if ref is None and registry.promoted_ref("device-ops") is None:
        raise PerfmodelError(f"no promoted device-ops model in {registry.root}: give --model NAME/VERSION (see "
                             "`perfmodel models list`) or promote an xgb-device-ops model with "
                             "`perfmodel models promote NAME/VERSION`")
    entry = registry.get(ref, role="device-ops")
    if entry.manifest.regressor != "xgb-device-ops":
        raise PerfmodelError(f"{entry.ref} is an {entry.manifest.regressor!r} model; predict-ops needs an "
                             "'xgb-device-ops' model (per op, any accelerator)")
    return load_regressor(entry.path), entry.ref


def _write_atomically(frame: Any, path: Path) -> None:
    """`frame` as CSV at `path` (compressed by its suffix), atomically (`_atomic_write`)."""
    _atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False, compression=_COMPRESSION.get(path.suffix.lower())))


def _atomic_write(path: Path, write: Callable[[str], Any]) -> None:
    """`write(tmp)` to a temporary file beside `path`, then renamed over it: a failure leaves no partial file."""
    import os
    import tempfile

    if not path.parent.is_dir():
        raise PerfmodelError(f"cannot write {path}: no such folder {path.parent}")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@app.command("predict-ops")
@user_errors
def predict_ops(
        table: Annotated[Path, typer.Argument(
            metavar="IN", help="CSV (or .csv.gz) of ops in NeuSight's schema: OPName, Device and the op's shape "
                               "columns (B, M, N, K / B, H / conv)")],
        output: Annotated[Path, typer.Argument(
            metavar="OUT", help="CSV to write: IN's columns + predicted_ms, p10_ms, p90_ms, extrapolated")],
        model: Annotated[Optional[str], typer.Option(
            "--model", help="NAME/VERSION (or NAME: its newest) of an xgb-device-ops model (default: the promoted "
                            "device-ops model)")] = None,
) -> None:
    """Predict the latency of every op of a table on its device (any hardware-catalog accelerator).

    OPName is one of bmm, linear, conv, add, addu, mul, mulu, div, divu, pow, powu, relu, gelu, tanh, softmax, ln;
    Device a catalog name or alias (`perfmodel hw list`); a `dtype` column (fp32, fp16, bf16) is optional (fp32)."""
    import time

    from perfmodel.hardware.catalog import load_catalog
    from perfmodel.predictor.op_table import ops_from_neusight_frame, read_op_table

    started = time.perf_counter()
    if not output.parent.is_dir():
        raise PerfmodelError(f"cannot write {output}: no such folder {output.parent}")
    frame = read_op_table(table)
    clash = [c for c in PREDICTION_COLUMNS if c in frame.columns]
    if clash:
        raise PerfmodelError(f"{table} already has column(s) {', '.join(clash)}: rename them (predict-ops adds them)")
    catalog = load_catalog()
    ops = ops_from_neusight_frame(frame, catalog)
    regressor, ref = _device_ops_model(model)
    predicted = regressor.predict(ops, catalog).frame(frame.index)
    _write_atomically(frame.join(predicted), output)
    devices = sorted(ops["device"].unique())
    extrapolated = int(predicted["extrapolated"].sum())
    out.print(f"predicted {len(frame)} ops on {len(devices)} device(s) ({', '.join(devices)}) with {ref} in "
              f"{time.perf_counter() - started:.2f} s -> {output}"
              + (f"; {extrapolated} extrapolated" if extrapolated else ""), highlight=False)


export_app = typer.Typer(no_args_is_help=True, help="Export predictions for schedulers.")
app.add_typer(export_app, name="export")


def _write_text_atomically(text: str, path: Path) -> None:
    _atomic_write(path, lambda tmp: Path(tmp).write_text(text))


@export_app.command("gavel")
@user_errors
def export_gavel(
    output: Annotated[Path, typer.Argument(help="JSON file to write (the consolidated matrix); the spread one "
                                                "goes to <stem>.spread.json beside it")],
    job: Annotated[list[str], typer.Option("--job", help="ZOO_NAME:BATCH, repeatable; BATCH is the job's batch "
                                                         "size: one worker's forward/backward pass (README, \"Batch "
                                                         "size\")")],
    accelerators: Annotated[str, typer.Option(help="comma-separated catalog names (Gavel's worker types)")],
    scale_factors: Annotated[str, typer.Option(help="comma-separated device counts")] = "1,2,4,8",
    seq_len: SeqOpt = None, precision: PrecisionOpt = "fp32", optimizer: OptimizerOpt = "sgd",
    inter_node_gbps: Annotated[Optional[float], typer.Option(
        help="network of one node over all its NICs, Gb/s [the catalog's node_network_gbit_s, else 100]")] = None,
) -> None:
    """Throughputs (samples/s) of jobs x accelerator types x scale factors in Gavel's layout
    {"('<job> (batch size B)', scale_factor)": {worker_type: throughput}}: data parallel with the job's batch on
    every worker (a global batch of B x scale_factor), consolidated (on one node, or on as few full nodes as the
    catalog's node_devices allow) and spread one device per node. A job that does not fit in a device's memory gets
    throughput 0."""
    import json

    from perfmodel.engine import EngineConfig, PredictionEngine
    from perfmodel.hardware.catalog import get_accelerator
    from perfmodel.placement.gavel import gavel_layout
    from perfmodel.placement.spec import Parallelism, PlacementSpec

    factors = _int_list(scale_factors, "--scale-factors")
    names = [a.strip() for a in accelerators.split(",") if a.strip()]
    jobs = []
    for item in job:
        name, _, batch = item.partition(":")
        if not batch.isdigit() or int(batch) < 1:
            raise PerfmodelError(f"--job: expected ZOO_NAME:BATCH like resnet50:32, got {item!r}")
        jobs.append(job_spec(name, None, None, None, None, int(batch), seq_len, precision, optimizer, "train"))
    engine = PredictionEngine.open(EngineConfig(isolate_captures=False))
    entries = []
    for spec in jobs:
        job_type = f"{spec.name} (batch size {spec.batch_size})"
        for accelerator in names:
            node_devices = get_accelerator(accelerator, engine.catalog).node_devices
            for sf in factors:
                full = min(sf, node_devices or sf)
                packed = (full,) * (sf // full) + ((sf % full,) if sf % full else ())
                layouts = [(True, packed)] + ([(False, (1,) * sf)] if sf > 1 else [])
                for consolidated, layout in layouts:
                    placement = PlacementSpec(accelerator=accelerator, devices_per_node=layout,
                                              global_batch_size=spec.batch_size * sf,
                                              parallelism=Parallelism(data=sf),
                                              inter_node_bandwidth_gbps=inter_node_gbps)
                    result = engine.prediction(spec, placement)
                    throughput = result.throughput_samples_per_s if result.fits else 0.0
                    entries.append((job_type, result.accelerator, sf, consolidated, throughput))
    matrices = gavel_layout(entries)
    spread_path = output.with_name(f"{output.stem}.spread.json")
    _write_text_atomically(json.dumps(matrices["consolidated"], indent=2, sort_keys=True) + "\n", output)
    _write_text_atomically(json.dumps(matrices["spread"], indent=2, sort_keys=True) + "\n", spread_path)
    out.print(f"wrote {output} and {spread_path}: {len(jobs)} jobs x {len(names)} worker types x scale factors "
              f"{factors}")


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PerfmodelError(f"{option}: expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise PerfmodelError(f"{option}: expected integers >= 1, got {text!r}")
    return values


from perfmodel.cli.serve import serve  # noqa: E402  (the HTTP service, issue 6)

app.command("serve")(serve)
app.command("retrain")(__import__("perfmodel.cli.retrain", fromlist=["retrain"]).retrain)  # issue 13


def main() -> None:
    app()

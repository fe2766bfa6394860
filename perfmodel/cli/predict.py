"""`perfmodel predict` (one job on one placement, from its graph alone: nothing is run) and `perfmodel predict-ops`
(every op of a NeuSight-format table on its device). The placement is built by perfmodel/placement/build.py, the
prediction made by the engine (perfmodel/engine/: `PredictionEngine`, op_table.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from perfmodel.cli.common import (
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
    PytorchOpt,
    SeqOpt,
    StepsVaryOpt,
    StoreOpt,
    TaskOpt,
    job_spec,
    out,
    print_json,
    user_errors,
    writable_folder,
)
from perfmodel.core.errors import PerfmodelError
from perfmodel.engine.errors import FieldError


@user_errors
def predict(ctx: typer.Context, model: ModelArg = None, hf_config: HFConfigOpt = None, task: TaskOpt = None,
            module: ModuleOpt = None, onnx: OnnxOpt = None,
            batch_size: Annotated[int, typer.Option(
                "--batch-size", "-b", help="samples in one forward/backward pass of one model replica (README, "
                                           "\"Batch size\")")] = 1,
            global_batch_size: Annotated[Optional[int], typer.Option(
                help="samples per iteration over all replicas and micro-batches [--batch-size x data-parallel "
                     "degree x --micro-batches]")] = None,
            seq_len: SeqOpt = None, precision: PrecisionOpt = "fp32", optimizer: OptimizerOpt = None,
            mode: ModeOpt = "train",
            channels_last: ChannelsLastOpt = False,
            fused_optimizer: FusedOptimizerOpt = False,
            pytorch_version: PytorchOpt = None,
            steps_vary: StepsVaryOpt = None,
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
            gradient_bucket_copy: Annotated[bool, typer.Option(
                help="data parallelism keeps a copy of every gradient in its all-reduce buckets (torch DDP's "
                     "default gradient_as_bucket_view=False); counted in the memory")] = False,
            intra_link: Annotated[Optional[str], typer.Option(
                help="override the catalog's intra-node link: nvlink1..5, infinity-fabric, pcie3..5, or host "
                     "(no peer-to-peer, as with NCCL_P2P_DISABLE=1)")] = None,
            ep: Annotated[int, typer.Option(help="expert-parallel degree (mixture of experts; divides the "
                                                 "data-parallel degree)")] = 1,
            inter_node_gbit_s: Annotated[Optional[float], typer.Option(
                "--inter-node-gbit-s", "--inter-node-gbps",
                help="network of one node over all its NICs, Gb/s \\[the catalog's node_network_gbit_s, else "
                     "100]")] = None,
            inter_node_latency_us: Annotated[float, typer.Option(help="network latency, us")] = 5.0,
            model_version: Annotated[Optional[str], typer.Option(help="NAME/VERSION \\[the promoted models]")] = None,
            store: StoreOpt = None,
            with_job: Annotated[Optional[str], typer.Option(
                "--with", help="ZOO_NAME:BATCH of a second job sharing the same GPU(s): both jobs' throughput "
                               "while they do (co-location)")] = None,
            sharing: Annotated[str, typer.Option(help="with --with: time-slicing (two processes) or mps")] =
                "time-slicing",
            batch_sizes: Annotated[Optional[str], typer.Option(
                help="a batch axis instead of --batch-size (give one or the other): per-device batch sizes, e.g. "
                     "8,16,32,64; one answer each (a goodput scheduler's sweep: the job is captured at three "
                     "batches, the rest is arithmetic)")] = None,
            as_json: JsonOpt = False) -> None:
    """Predict a job's iteration time, throughput and per-device memory on a placement from its graph alone
    (nothing is run). Compute per device comes from the per-op device model on a GPU (any catalog GPU, from its
    spec sheet) or the iteration model on the profiled CPU; the placement model adds communication, the pipeline
    bubble and the memory of each device's shard. `--batch-size` is the job's batch (one replica's forward/backward
    pass); the placement runs `--global-batch-size` samples per iteration, by default that batch on every
    data-parallel replica and micro-batch."""
    from perfmodel.engine import EngineConfig, PredictionEngine, fleet_priors_from
    from perfmodel.placement.build import placement_from_options

    given = ctx.get_parameter_source("batch_size")  # click's ParameterSource (typer vendors its own click)
    if batch_sizes is not None and given is not None and given.name == "COMMANDLINE":
        raise PerfmodelError("--batch-sizes replaces -b/--batch-size: give one or the other")
    spec = job_spec(model, hf_config, task, module, onnx, batch_size, seq_len, precision, optimizer, mode,
                    channels_last=channels_last, fused_optimizer=fused_optimizer, pytorch_version=pytorch_version,
                    steps_vary=steps_vary)
    placement = placement_from_options(
        accelerator, global_batch_size, batch_size=batch_size, nodes=nodes, per_node=per_node,
        devices_per_node=devices_per_node, tp=tp, pp=pp, micro_batches=micro_batches, zero=zero,
        checkpointing=checkpointing, intra_link=intra_link, ep=ep, inter_node_gbit_s=inter_node_gbit_s,
        inter_node_latency_us=inter_node_latency_us, gradient_bucket_copy=gradient_bucket_copy)
    from perfmodel.settings import get_settings
    from perfmodel.store.jobs import JobStore

    # on the store the service uses: its custom accelerators, its promoted models and the fleet's observations
    job_store = JobStore(store)
    try:
        settings = get_settings()
        engine = PredictionEngine.open(EngineConfig(model_version=model_version, isolate_captures=False,
                                                    graph_dir=settings.home / "graphs",
                                                    fleet_priors=fleet_priors_from(settings)), store=job_store)
        engine.hardware(accelerator)  # a misspelt or ambiguous accelerator is refused before any capture
        _answer(engine, spec, placement, with_job=with_job, sharing=sharing, batch_sizes=batch_sizes,
                global_batch_size=global_batch_size, accelerator=accelerator, seq_len=seq_len, precision=precision,
                optimizer=optimizer, mode=mode, as_json=as_json,
                options=dict(nodes=nodes, per_node=per_node, devices_per_node=devices_per_node, tp=tp, pp=pp,
                             micro_batches=micro_batches, zero=zero, checkpointing=checkpointing,
                             intra_link=intra_link, ep=ep, inter_node_gbit_s=inter_node_gbit_s,
                             inter_node_latency_us=inter_node_latency_us,
                             gradient_bucket_copy=gradient_bucket_copy))
    finally:
        job_store.close()


def _answer(engine: Any, spec: Any, placement: Any, *, with_job: str | None, sharing: str, batch_sizes: str | None,
            global_batch_size: int | None, accelerator: str, seq_len: Any, precision: str, optimizer: str | None,
            mode: str, as_json: bool, options: dict[str, Any]) -> None:
    """Print the engine's answer for the job on the placement (or both jobs with `--with`, or the batch axis)."""
    if with_job is not None:
        _colocated(engine, spec, with_job, placement, sharing, seq_len, precision, optimizer, mode, as_json)
        return
    if batch_sizes is not None:
        if global_batch_size is not None:
            raise PerfmodelError("--batch-sizes sets each answer's batch: leave --global-batch-size out")
        _batch_axis(engine, spec, _sizes(batch_sizes), accelerator, options, as_json)
        return
    # a job the service registered answers as it does there, with its own observations; else the spec inline
    ref = spec.key() if engine.store.get_job(spec.key()) is not None else spec
    result = engine.predict(ref, placement)  # calibrated by what `perfmodel hw bench` kept of this device
    if as_json:
        print_json(result)
        return
    lo, hi = result["interval_ms"]
    layout = "+".join(str(n) for n in placement.devices_per_node)
    out.print(f"[bold]{result['job_name']}[/] {_batch(spec.batch_size, placement)} {spec.mode.value}{_software(spec)} "
              f"on {layout} x {result['accelerator']}: {result['iter_time_ms']:.2f} ms/iteration "
              f"(80 % interval {lo:.2f}-{hi:.2f}), "
              f"{result['throughput_samples_per_s']:.1f} samples/s  [dim]{result['model_version']}[/]")
    out.print("  " + ", ".join(f"{k} {v:.2f} ms" for k, v in result["breakdown_ms"].items()))
    calibration = result["calibration"]
    if calibration["level"] != "none":
        evidence = "; ".join(f"{'its own' if name == 'job' else 'on the ' + name} {found['observations']} "
                             f"observation(s)" + ("" if name == "job" else f" of {found['jobs']} job(s)")
                             for name, found in calibration["sources"].items())
        out.print(f"  calibrated x{calibration['factor']:.3f} at level {calibration['level']} ({evidence}); "
                  f"uncalibrated {result['uncalibrated_iter_time_ms']:.2f} ms")
    fits = "fits" if result["fits"] else "[red]does not fit[/]"
    out.print(f"  peak memory per device ~{result['peak_memory_bytes'] / 2**30:.2f} GiB of "
              f"{(result['memory_capacity_bytes'] or 0) / 2**30:.1f} GiB usable: {fits}")
    if result["extrapolated"]:
        out.print("  [yellow]extrapolated:[/] " + "; ".join(result["extrapolation_reasons"]))
    if result.get("host_bound_likely"):
        out.print(f"  [yellow]host-bound likely:[/] {result['host_bound_reason']}")


def _batch(batch_size: int, placement: Any) -> str:
    """"b=32", the job's batch (one replica's forward/backward), and the placement's global batch where it differs:
    "b=32 (global batch 64)"."""
    global_batch = placement.global_batch_size
    return f"b={batch_size}" + (f" (global batch {global_batch})" if global_batch != batch_size else "")


def _sizes(text: str) -> list[int]:
    sizes = [part.strip() for part in text.split(",") if part.strip()]
    if not sizes or not all(part.isdigit() and int(part) >= 1 for part in sizes):
        raise PerfmodelError(f"--batch-sizes: expected positive integers separated by commas, e.g. 8,16,32; got "
                             f"{text!r}")
    return list(dict.fromkeys(int(part) for part in sizes))


def _software(spec: Any) -> str:
    """" (PyTorch 1.4)" for a job that names the PyTorch it is answered for, else nothing (the newest)."""
    return f" (PyTorch {spec.pytorch_version})" if spec.pytorch_version else ""


def _batch_axis(engine: Any, spec: Any, sizes: list[int], accelerator: str, options: dict[str, Any],
                as_json: bool) -> None:
    """`perfmodel predict ... --batch-sizes 8,16,32`: the job at each per-device batch on the placement."""
    from perfmodel.jobs.spec import GraphSource
    from perfmodel.placement.build import placement_from_options

    if isinstance(spec.source, GraphSource) and sizes != [spec.batch_size]:
        raise PerfmodelError("--batch-sizes: a graph IR holds the shapes of one batch; register the IR of each batch")
    first = engine.job(spec)
    engine.graphs.prepare_batches(spec, first.graph)  # two more captures: every other batch is arithmetic
    specs = [spec.model_copy(update={"batch_size": b}) for b in sizes]
    placements = [placement_from_options(accelerator, None, batch_size=b, **options) for b in sizes]
    entries = [engine.job(s) for s in specs]
    engine.prefetch([([entry], [placement]) for entry, placement in zip(entries, placements)], ("placement",))
    results = [engine.predict(s, p) for s, p in zip(specs, placements)]
    if as_json:
        print_json(results)
        return
    head = results[0]
    out.print(f"[bold]{head['job_name']}[/] {spec.mode.value}{_software(spec)} on "
              f"{'+'.join(map(str, placements[0].devices_per_node))} x {head['accelerator']}  "
              f"[dim]{head['model_version']}[/]")
    out.print(f"  {'batch/device':>12} {'global batch':>12} {'ms/iteration':>13} {'samples/s':>11} {'memory GiB':>11}")
    for size, placement, result in zip(sizes, placements, results):
        fits = "" if result["fits"] else "  [red]does not fit[/]"
        out.print(f"  {size:>12} {placement.global_batch_size:>12} {result['iter_time_ms']:>13.2f} "
                  f"{result['throughput_samples_per_s']:>11.1f} {result['peak_memory_bytes'] / 2**30:>11.2f}{fits}")


def _colocated(engine: Any, spec: Any, other: str, placement: Any, sharing: str, seq_len: Any, precision: str,
               optimizer: str | None, mode: str, as_json: bool) -> None:
    """`perfmodel predict ... --with ZOO:BATCH`: both jobs sharing the placement's GPU(s)."""
    from perfmodel.engine import SamePlacement
    from perfmodel.placement.colocation import SHARING_MODES

    if sharing not in SHARING_MODES:
        raise PerfmodelError(f"--sharing: expected one of {', '.join(SHARING_MODES)}, got {sharing!r}")
    name, _, batch = other.partition(":")
    if not name or not batch.isdigit() or int(batch) < 1:
        raise PerfmodelError(f"--with: expected ZOO_NAME:BATCH like resnet50:32, got {other!r}")
    try:
        second = job_spec(name, None, None, None, None, int(batch), seq_len, precision, optimizer, mode)
    except PerfmodelError as exc:
        raise PerfmodelError(f"--with: {exc}") from None
    per_job = SamePlacement(placement)
    # jobs the service registered answer as they do there, with their own reports while sharing
    refs = [job.key() if engine.store.get_job(job.key()) is not None else job for job in (spec, second)]
    try:
        result = engine.colocation(refs, per_job, sharing)
    except FieldError as exc:
        raise PerfmodelError(f"--with: {exc}") from None
    if as_json:
        print_json(result)
        return
    for i, job in enumerate((spec, second)):
        out.print(f"[bold]{job.name}[/] {_batch(job.batch_size, per_job.to_spec(job.batch_size))}: "
                  f"{result['throughput_samples_per_s'][i]:.1f} samples/s "
                  f"sharing {result['devices']} x {result['accelerator']} ({sharing}), "
                  f"{result['isolated_throughput_samples_per_s'][i]:.1f} alone (x{1 / result['slowdown'][i]:.2f})")
        applied = result["calibration"][i]
        if applied["level"] != "none":
            out.print(f"  calibrated x{applied['factor']:.3f} by its {applied['observations']} report(s) while "
                      f"sharing {result['accelerator']} with {applied['partners']} other job(s)")
    held = (f"their kernels hold {100 * result['sm_fill'][0]:.0f} % and {100 * result['sm_fill'][1]:.0f} % of the "
            f"SMs; " if sharing == "mps" else "")
    out.print(f"  {held}device busy {100 * result['combined_device_share']:.0f} %; memory per device "
              f"{sum(result['peak_memory_bytes']) / 2**30:.2f} GiB of "
              f"{(result['memory_capacity_bytes'] or 0) / 2**30:.1f} GiB usable")


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

    from perfmodel.engine.op_table import predict_op_table, write_csv_atomically

    started = time.perf_counter()
    writable_folder(output)
    result = predict_op_table(table, model)
    write_csv_atomically(result.frame, output)
    extrapolated = result.extrapolated
    out.print(f"predicted {len(result.frame)} ops on {len(result.devices)} device(s) ({', '.join(result.devices)}) "
              f"with {result.model_ref} in {time.perf_counter() - started:.2f} s -> {output}"
              + (f"; {extrapolated} extrapolated" if extrapolated else ""), highlight=False)

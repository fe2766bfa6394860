"""`perfmodel hw list|show|probe|add|bench` and `perfmodel adapt`: the hardware catalog, this host measured, custom
accelerators from spec sheets, and the device model adapted to this machine's device.

`hw add SPEC` stores a custom accelerator from a spec sheet (YAML or JSON of `HardwareSpec` fields, numbers bare in
the field's unit or with a unit: "3.35 TB/s") so that every process on the store predicts for it. `hw bench
--device cuda:0` probes the device (matched to the catalog, or recorded as a new local entry), times the candidate
shapes the shipped model is least sure of until its budget is spent, stores them in `op_measurements` (source
`microbench`, one transaction per batch; perfmodel/evaluation/bench.py) and fits the device's adaptation
(perfmodel/evaluation/training.py `fit_adaptation`), which every later prediction for that device loads.
Re-running with the same `--run-id` skips the shapes already stored. `adapt` fits the adaptation from whatever rows
the store holds for a device.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from perfmodel.cli.common import JsonOpt, StoreOpt, out, print_json, user_errors
from perfmodel.core.errors import PerfmodelError

if TYPE_CHECKING:
    from perfmodel.hardware.spec import HardwareSpec

hw_app = typer.Typer(no_args_is_help=True, help="The hardware catalog: list, show, probe this host, add a "
                                                "spec sheet, bench this machine's device.")


@hw_app.command("list")
@user_errors
def hw_list(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """List the catalog's accelerators, and the store's custom ones (`perfmodel hw add`)."""
    from rich.table import Table

    entries = sorted(_catalog(store).values(), key=lambda e: (e.kind, e.vendor, e.release_year or 0, e.name))
    if as_json:
        print_json([e.model_dump(mode="json") for e in entries])
        return

    def tflops(gflops: float | None) -> str:
        return "-" if gflops is None else f"{gflops / 1000:.3g}" if gflops < 10_000 else f"{gflops / 1000:.0f}"

    table = Table("id", "kind", "vendor", "fp32 TFLOP/s", "fp16/bf16 TFLOP/s", "memory GB", "bandwidth GB/s",
                  title=f"{len(entries)} accelerators (`perfmodel hw show ID` for every field)")
    for e in entries:
        table.add_row(e.name, e.kind, e.vendor, tflops(e.peak_fp32_gflops), tflops(e.peak_fp16_gflops
                                                                              or e.peak_bf16_gflops),
                      f"{e.memory_gb:g}", f"{e.memory_bandwidth_gb_s:.0f}")
    out.print(table)


@hw_app.command("show")
@user_errors
def hw_show(name: Annotated[str, typer.Argument(help="catalog name or alias")], store: StoreOpt = None) -> None:
    """Show one accelerator (any alias resolves), the store's custom ones too, as JSON."""
    from perfmodel.hardware.catalog import get_accelerator

    print_json(get_accelerator(name, _catalog(store)).model_dump(mode="json"))


def _catalog(store: str | None) -> dict[str, Any]:
    """The catalog (shipped + local entries) with the store's custom accelerators, as predictions see it."""
    from perfmodel.hardware.custom import catalog_with
    from perfmodel.store import ProfileStore
    from perfmodel.store.accelerators import custom_accelerators

    with ProfileStore(store) as profile_store:
        return catalog_with(custom_accelerators(profile_store))


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
                  f"{spec.peak_fp32_gflops:.1f} GFLOP/s fp32 GEMM, {spec.memory_bandwidth_gb_s:.1f} GB/s copy, "
                  f"{spec.memory_gb:.1f} GB" + (" (saved)" if save else ""))


@hw_app.command("add")
@user_errors
def hw_add(
    spec_file: Annotated[Path, typer.Argument(help="spec sheet, YAML or JSON, e.g. {name: acme-x1, kind: gpu, "
                                                 "peak_fp32_gflops: 60 TFLOP/s, memory_bandwidth_gb_s: 3 TB/s, "
                                                 "memory_gb: 96, compute_units: 120}")],
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add a custom accelerator (a spec sheet) to the store; predictions for it are flagged extrapolated."""
    from perfmodel.hardware.custom import catalog_with, parse_spec_sheet, validate_spec_sheet
    from perfmodel.store import ProfileStore
    from perfmodel.store.accelerators import add_accelerator, custom_accelerators

    try:
        text = spec_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PerfmodelError(f"cannot read spec sheet {spec_file}: {exc}") from None
    data = parse_spec_sheet(text, str(spec_file))
    with ProfileStore(store) as profile_store:
        spec = validate_spec_sheet(data, catalog_with(custom_accelerators(profile_store)))
        record, created = add_accelerator(profile_store, spec)
    if as_json:
        typer.echo(json.dumps({"created": created, **record.spec.model_dump(mode="json")}, indent=2))
    else:
        verb = "added" if created else "already stored (same figures)"
        typer.echo(f"{record.spec.name}: {verb} in {profile_store!r}; `perfmodel predict` and the service on this "
                   f"store predict for it (flagged extrapolated: a spec sheet, no measurements)")


# below this rate (GB/s) at which new pages are faulted in, `hw bench` says what its sweep does not see
SLOW_FIRST_TOUCH_GB_S = 10.0


def first_touch_notice(rate_gb_s: float | None) -> str | None:
    """What `hw bench` tells a user whose host faults in the pages of new large tensors slowly (`rate_gb_s`, from
    `probe.first_touch_gb_s`; None: free): nothing at or above `SLOW_FIRST_TOUCH_GB_S`."""
    from perfmodel.core.cost import memory_ms
    from perfmodel.core.units import BYTES_PER_MIB
    from perfmodel.hardware.probe import FIRST_TOUCH_MIB, FRESH_MAP_BYTES

    if rate_gb_s is None or rate_gb_s >= SLOW_FIRST_TOUCH_GB_S:
        return None
    ms, large_mib = memory_ms(FIRST_TOUCH_MIB * BYTES_PER_MIB, rate_gb_s), FRESH_MAP_BYTES // BYTES_PER_MIB
    return (f"new memory: this host faults in the pages of a new tensor of {large_mib} MiB or more "
            f"at {rate_gb_s:.1f} GB/s ({ms:.0f} ms for {FIRST_TOUCH_MIB} MiB before its kernel runs); predictions "
            f"for this CPU now charge the tensors that large a job makes each step (a large vocabulary's embedding "
            f"and its gradient, Adam's temporaries of it, large activations), which the op sweep does not see "
            f"(docs/hardware.md)")


def _with_first_touch(hardware: HardwareSpec) -> HardwareSpec:
    """The CPU's catalog entry with the rate at which this host faults in new large tensors' pages
    (`probe.first_touch_gb_s`), saved as its local entry when that rate changed (every later prediction for the CPU
    then charges such tensors: `gpu_iteration.fresh_tensor_ms`); says so when the rate is slow."""
    from perfmodel.hardware.catalog import save_local
    from perfmodel.hardware.probe import first_touch_gb_s

    rate = first_touch_gb_s()
    rate = round(rate, 2) if rate is not None else None
    notice = first_touch_notice(rate)
    if notice:
        typer.echo(notice)
    if rate == hardware.first_touch_gb_s:
        return hardware
    updated = hardware.model_copy(update={"first_touch_gb_s": rate})
    save_local(updated)
    return updated


@hw_app.command("bench")
@user_errors
def hw_bench(
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or rocm")] = "cpu",
    budget_s: Annotated[Optional[float], typer.Option(
        "--budget-s", help="stop starting new shapes after this many seconds [240 on a CPU, 600 on a GPU]")] = None,
    store: StoreOpt = None,
    run_id: Annotated[Optional[str], typer.Option(
        help="name of this sweep; re-running with the same id skips the shapes stored \\[bench-<device>]")] = None,
    classes: Annotated[str, typer.Option(help="comma-separated op classes")] =
        "bmm,linear,conv2d,elementwise,softmax,layernorm",
    adapt: Annotated[bool, typer.Option(help="fit the device's adaptation from its rows afterwards")] = True,
    max_op_ms: Annotated[Optional[float], typer.Option(
        help="leave out shapes whose roofline x 3 exceeds this [150 on a CPU, 50 on a GPU]")] = None,
    steps: Annotated[bool, typer.Option(help="also time whole training steps of reference zoo jobs, and keep what "
                                             "beats not keeping it on held-out steps")] = True,
    steps_budget_s: Annotated[Optional[float], typer.Option(
        "--steps-budget-s", help="seconds for the whole steps [150 on a CPU, 300 on a GPU]")] = None,
) -> None:
    """Time the op classes the device model learns on this machine's device, store them, adapt the model; then
    time whole training steps of reference jobs and keep, of the adaptation and the steps' calibration, what
    answers held-out steps better than the model as shipped."""
    import shutil

    from perfmodel.evaluation.bench import bench_device
    from perfmodel.evaluation.device_steps import (
        DEFAULT_STEPS_BUDGET_S,
        judge,
        own_held_out_mape_pct,
        predictors_for,
        time_steps,
    )
    from perfmodel.evaluation.training import fit_adaptation
    from perfmodel.regressors.adaptation import adaptations_dir
    from perfmodel.store.device_steps import delete_device_steps, save_device_steps
    from perfmodel.torch_device import resolve_device

    if steps_budget_s is not None and steps_budget_s <= 0:
        raise PerfmodelError("--steps-budget-s must be positive")
    run = bench_device(device, store, classes.split(","), budget_s=budget_s, run_id=run_id, max_op_ms=max_op_ms,
                       progress=typer.echo)
    typer.echo(run.summary())
    catalog = run.catalog
    if catalog[run.device].kind == "cpu":
        catalog = {**catalog, run.device: _with_first_touch(catalog[run.device])}
    # with --steps, whole steps decide whether the adaptation stays: its "adapted ...: FOLDER" line waits for them
    fitted: list[str] = []
    adaptation = (fit_adaptation(run.device, store, catalog, fitted.append if steps else typer.echo)
                  if adapt else None)
    if not steps:
        return
    if adaptation is not None:
        rows = sum(adaptation.rows_per_class.values())
        typer.echo(f"fitted the op-sweep adaptation to {run.device} ({rows} rows); whole training steps decide "
                   f"whether it is applied")
    hardware = catalog[run.device]
    timed = time_steps(resolve_device(device), run.device, hardware.kind,
                       steps_budget_s or DEFAULT_STEPS_BUDGET_S[hardware.kind], typer.echo)
    if len(timed) < 2:
        typer.echo(f"{len(timed)} whole step(s) timed: too few to judge anything on held-out steps (raise "
                   f"--steps-budget-s); the steps are not kept")
        if adaptation is not None:
            typer.echo("op-sweep adaptation: applied without that judgement")
            for line in fitted:
                typer.echo(line)
        return
    verdict = judge(timed, hardware, predictors_for(run.device, adaptation, catalog),
                    own_held_out_mape_pct(hardware.kind))
    typer.echo(f"{len(timed)} whole steps on {run.device}, each predicted without its own measurement:")
    for line in verdict.lines():
        typer.echo(line)
    if adaptation is not None:
        mape = verdict.mape_pct
        versus = f"{mape.get((True, False), float('nan')):.1f} % vs {mape[(False, False)]:.1f} % MAPE"
        if verdict.adapt:
            typer.echo(f"op-sweep adaptation: applied (it beat the model as shipped on held-out steps: {versus})")
            for line in fitted:
                typer.echo(line)
        else:
            shutil.rmtree(adaptations_dir() / run.device, ignore_errors=True)
            if verdict.within:
                why = "the model as shipped answers the steps within its own held-out error"
            elif mape.get((True, False), float("inf")) < mape[(False, False)]:
                why = (f"it beat the model as shipped ({versus}), not the calibration without it "
                       f"({min(mape[(True, False)], mape[(True, True)]):.1f} % vs {mape[(False, True)]:.1f} % MAPE)")
            else:
                why = f"it did not beat the model as shipped on held-out steps: {versus}"
            typer.echo(f"op-sweep adaptation: not applied ({why}); its rows stay in the store (`perfmodel adapt "
                       f"--device {run.device}` fits it again)")
    if verdict.calibrate:
        path = save_device_steps(run.device, timed)
        typer.echo(f"kept the steps in {path}: every prediction for {run.device} is calibrated by them")
    elif delete_device_steps(run.device):
        why = ("the model as shipped answers them within its own held-out error" if verdict.within else
               "they do not help on held-out steps")
        typer.echo(f"dropped the steps kept before for {run.device}: {why}")


@user_errors
def adapt_command(
    device: Annotated[str, typer.Option(help="catalog name or alias of the device")],
    store: StoreOpt = None,
) -> None:
    """Fit the device model's adaptation to DEVICE from the rows the store holds for it (any source); every
    later prediction for DEVICE uses it (saved in PERFMODEL_HOME/adaptations/)."""
    from perfmodel.evaluation.training import fit_adaptation
    from perfmodel.hardware.catalog import get_accelerator, load_catalog

    catalog = load_catalog()
    fit_adaptation(get_accelerator(device, catalog).name, store, catalog, typer.echo)

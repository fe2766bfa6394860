"""`perfmodel hw bench` (time this machine's device, store the rows, adapt the device model to it) and
`perfmodel adapt` (fit the adaptation from the rows a store holds for a device).

The loop: `perfmodel hw bench --device cuda:0` probes the GPU (matched to the catalog, or recorded as a new local
entry), times the candidate shapes the shipped model is least sure of until its budget is spent, stores them in
`op_measurements` (source `microbench`, one transaction per batch) and fits the device's adaptation
(`perfmodel.regressors.adaptation`), saved under `$PERFMODEL_HOME/adaptations/<device>/`. From then on every
prediction for that device (`perfmodel predict --accelerator NAME`, the service) loads it with the device model.
Re-running with the same `--run-id` skips the shapes already stored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer

DEFAULT_BUDGET_S = {"cpu": 240.0, "gpu": 600.0}


def _device_model(catalog: dict) -> tuple[Any, str] | tuple[None, None]:
    from perfmodel.registry.registry import ModelRegistry
    from perfmodel.regressors import load_regressor

    registry = ModelRegistry()
    if registry.promoted_ref("device-ops") is None:
        return None, None
    entry = registry.get(None, role="device-ops")
    return load_regressor(entry.path), entry.ref


def fit_adaptation(device: str, store_url: str | None, catalog: dict, say: Callable[[str], None]) -> Any:
    """Fit and save the adaptation of `device` from every row the store holds for it; returns it."""
    from perfmodel.core.errors import PerfmodelError
    from perfmodel.evaluation.device_ops import training_rows
    from perfmodel.regressors.adaptation import DeviceAdaptation, adaptations_dir
    from perfmodel.store import ProfileStore

    model, ref = _device_model(catalog)
    if model is None:
        raise PerfmodelError("no promoted device-ops model to adapt (see `perfmodel models list`)")
    with ProfileStore(store_url) as store:
        rows = training_rows(store.op_measurements(device=device, extra=False))
    rows = rows[rows["op_class"].isin(set(model.boosters_))]
    if rows.empty:
        raise PerfmodelError(f"the store holds no measured ops of {device!r}: run `perfmodel hw bench` first")
    adaptation = DeviceAdaptation.fit(model, rows, catalog, device=device)
    directory = adaptations_dir() / device
    adaptation.save(directory)
    counts = ", ".join(f"{c} {n}" for c, n in adaptation.rows_per_class.items())
    say(f"adapted {ref} to {device} ({counts} rows): {directory}")
    return adaptation


def register(hw_app: typer.Typer, app: typer.Typer, user_errors: Callable) -> None:
    """Add `hw bench` to the `hw` group and `adapt` to the top level."""

    @hw_app.command("bench")
    @user_errors
    def hw_bench(
        device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or rocm")] = "cpu",
        budget_s: Annotated[Optional[float], typer.Option(
            "--budget-s", help="stop starting new shapes after this many seconds [240 on a CPU, 600 on a GPU]")] = None,
        store: Annotated[Optional[str], typer.Option("--store", help="store URL [env PERFMODEL_STORE_URL, "
                                                     "else sqlite in PERFMODEL_HOME]")] = None,
        run_id: Annotated[Optional[str], typer.Option(
            help="name of this sweep; re-running with the same id skips the shapes stored [bench-<device>]")] = None,
        classes: Annotated[str, typer.Option(help="comma-separated op classes")] =
            "bmm,linear,conv2d,elementwise,softmax,layernorm",
        adapt: Annotated[bool, typer.Option(help="fit the device's adaptation from its rows afterwards")] = True,
        max_op_ms: Annotated[Optional[float], typer.Option(
            help="leave out shapes whose roofline x 3 exceeds this [50 on a CPU and a GPU]")] = None,
    ) -> None:
        """Time the op classes the device model learns on this machine's device, store them, adapt the model."""
        from perfmodel.core.errors import PerfmodelError
        from perfmodel.hardware.catalog import load_catalog, save_local
        from perfmodel.profilers.bench_rows import SOURCE, done_keys, software_versions, timing_rows
        from perfmodel.profilers.microbench import (
            BENCH_CLASSES,
            candidate_grid,
            order_candidates,
            probe_device,
            roofline_by_key,
            run_sweep,
        )
        from perfmodel.store import ProfileStore

        wanted = [c.strip() for c in classes.split(",") if c.strip()]
        unknown = sorted(set(wanted) - set(BENCH_CLASSES))
        if unknown or not wanted:
            raise PerfmodelError(f"--classes: unknown op class(es) {unknown}; known: {', '.join(BENCH_CLASSES)}")
        if budget_s is not None and budget_s <= 0:
            raise PerfmodelError("--budget-s must be positive")
        catalog = load_catalog()
        probed = probe_device(device, catalog)
        spec = probed.spec
        if probed.new_entry:
            path = save_local(spec)
            catalog = load_catalog()
            typer.echo(f"new accelerator {spec.name!r} recorded in {path} (measured: "
                       f"{spec.peak_fp32_gflops:.0f} GFLOP/s fp32, {spec.memory_bandwidth_gbps:.0f} GB/s)")
        model, ref = _device_model(catalog)
        shapes = order_candidates(candidate_grid(spec, wanted), spec, catalog, model, max_op_ms)
        run = run_id or f"bench-{spec.name}"
        budget = budget_s if budget_s is not None else DEFAULT_BUDGET_S[spec.kind]
        versions = software_versions()
        stored = [0]
        with ProfileStore(store) as profile_store:
            done = done_keys(profile_store.op_measurements(source=SOURCE, device=spec.name), run, spec.name)

            def keep(batch: list) -> None:  # one transaction per batch: a crash loses at most this batch
                stored[0] += profile_store.add_op_measurements(
                    timing_rows(batch, spec.name, run, versions, probed.properties))

            typer.echo(f"{spec.name} ({probed.torch_device}): {len(shapes)} candidate shapes, {len(done)} already "
                       f"stored in run {run!r}; budget {budget:.0f} s" + (f"; ordered by {ref}" if ref else ""))
            result = run_sweep(shapes, probed.torch_device, budget, done=done, on_batch=keep,
                               roofline_ms=roofline_by_key(shapes, spec, catalog))
        typer.echo(f"timed {len(result.timings)} shapes in {result.elapsed_s:.0f} s ({stored[0]} rows stored, "
                   f"{result.skipped_done} skipped as done, {result.left} left for a later run)"
                   + (f"; {len(result.failed)} left out, e.g. {result.failed[0]}" if result.failed else ""))
        if adapt:
            fit_adaptation(spec.name, store, catalog, typer.echo)

    @app.command("adapt")
    @user_errors
    def adapt_command(
        device: Annotated[str, typer.Option(help="catalog name or alias of the device")],
        store: Annotated[Optional[str], typer.Option("--store", help="store URL [env PERFMODEL_STORE_URL, "
                                                     "else sqlite in PERFMODEL_HOME]")] = None,
    ) -> None:
        """Fit the device model's adaptation to DEVICE from the rows the store holds for it (any source); every
        later prediction for DEVICE uses it (saved in PERFMODEL_HOME/adaptations/)."""
        from perfmodel.hardware.catalog import get_accelerator, load_catalog

        catalog = load_catalog()
        fit_adaptation(get_accelerator(device, catalog).name, store, catalog, typer.echo)


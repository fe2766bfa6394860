"""A benchmark sweep of this machine's device for the device model (`perfmodel hw bench`): probe the device (matched
to the catalog, or recorded as a new local entry), time the candidate shapes the promoted device-ops model is least
sure of until the budget is spent (perfmodel/profilers/microbench.py) and store them in `op_measurements` (source
`microbench`, one transaction per batch: a crash loses at most one batch). Re-running with the same run id skips the
shapes already stored. The adaptation fitted from those rows is `perfmodel.evaluation.training.fit_adaptation`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from perfmodel.core.errors import PerfmodelError

DEFAULT_BUDGET_S = {"cpu": 240.0, "gpu": 600.0}


@dataclass(frozen=True)
class BenchRun:
    """What a sweep did: the device's catalog name, the catalog it was planned with (with a new entry for a device the
    catalog lacked) and the sweep's result (`microbench.SweepResult`)."""

    device: str
    catalog: dict[str, Any]
    result: Any
    stored_rows: int

    def summary(self) -> str:
        result = self.result
        return (f"timed {len(result.timings)} shapes in {result.elapsed_s:.0f} s ({self.stored_rows} rows stored, "
                f"{result.skipped_done} skipped as done, {result.left} left for a later run)"
                + (f"; {len(result.failed)} left out, e.g. {result.failed[0]}" if result.failed else ""))


def bench_classes(classes: Sequence[str]) -> list[str]:
    """The op classes asked for, refused when empty or unknown."""
    from perfmodel.profilers.microbench import BENCH_CLASSES

    wanted = [c.strip() for c in classes if c.strip()]
    unknown = sorted(set(wanted) - set(BENCH_CLASSES))
    if unknown or not wanted:
        raise PerfmodelError(f"--classes: unknown op class(es) {unknown}; known: {', '.join(BENCH_CLASSES)}")
    return wanted


def bench_device(device: str, store_url: str | None, classes: Sequence[str], *, budget_s: float | None = None,
                 run_id: str | None = None, max_op_ms: float | None = None,
                 progress: Callable[[str], None] = lambda _message: None) -> BenchRun:
    """Time `classes` on `device` (cpu, cuda, cuda:N, rocm) for at most `budget_s` seconds (default by device kind,
    `DEFAULT_BUDGET_S`) and store every timing in the store at `store_url` under `run_id` (bench-<device>)."""
    from perfmodel.engine.op_table import promoted_device_ops_model
    from perfmodel.hardware.catalog import load_catalog, save_local
    from perfmodel.profilers.bench_rows import SOURCE, done_keys, software_versions, timing_rows
    from perfmodel.profilers.microbench import (
        candidate_grid,
        order_candidates,
        probe_device,
        roofline_by_key,
        run_sweep,
    )
    from perfmodel.store import ProfileStore

    wanted = bench_classes(classes)
    if budget_s is not None and budget_s <= 0:
        raise PerfmodelError("--budget-s must be positive")
    catalog = load_catalog()
    probed = probe_device(device, catalog)
    spec = probed.spec
    if probed.new_entry:
        path = save_local(spec)
        catalog = load_catalog()
        progress(f"new accelerator {spec.name!r} recorded in {path} (measured: "
                 f"{spec.peak_fp32_gflops:.0f} GFLOP/s fp32, {spec.memory_bandwidth_gb_s:.0f} GB/s)")
    model, ref = promoted_device_ops_model()
    shapes = order_candidates(candidate_grid(spec, wanted), spec, catalog, model, max_op_ms)
    run = run_id or f"bench-{spec.name}"
    budget = budget_s if budget_s is not None else DEFAULT_BUDGET_S[spec.kind]
    versions = software_versions()
    stored = 0
    with ProfileStore(store_url) as profile_store:
        done = done_keys(profile_store.op_measurements(source=SOURCE, device=spec.name), run, spec.name)

        def keep(batch: list[Any]) -> None:  # one transaction per batch: a crash loses at most this batch
            nonlocal stored
            stored += profile_store.add_op_measurements(timing_rows(batch, spec.name, run, versions, probed.properties))

        progress(f"{spec.name} ({probed.torch_device}): {len(shapes)} candidate shapes, {len(done)} already "
                 f"stored in run {run!r}; budget {budget:.0f} s" + (f"; ordered by {ref}" if ref else ""))
        result = run_sweep(shapes, probed.torch_device, budget, done=done, on_batch=keep,
                           roofline_ms=roofline_by_key(shapes, spec, catalog))
    return BenchRun(spec.name, catalog, result, stored)

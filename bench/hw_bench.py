"""Does `perfmodel hw bench` help on this machine? Whole training steps of jobs it never times, predicted before and
after it, against their measured steps.

    .venv/bin/python bench/hw_bench.py [--budget-s S] [--steps-budget-s S] [--home DIR]

In a fresh PERFMODEL_HOME (`--home`, default a temporary folder): times 16 held-out cases (8 small zoo jobs none of
which `hw bench` runs, at two batch sizes each; warm-up, then the median of timed repeats), predicts each with the
prediction engine as shipped, runs `perfmodel hw bench --device cpu` (op sweep + whole reference steps + the held-out
judgement of what to keep), predicts again with a new engine, and prints the MAPE and worst case before and after,
per case and overall. The judged target: after, within 15 % and never worse than before. `--record [RUN]` records
hw bench's held-out verdict and the MAPE before and after for docs/accuracy.md (bench/_figures.py).

The host changes from machine to machine, and a change to the adaptation or the calibration can only be judged on
hosts measured before. `--save-run FILE` writes what this run measured (the host's CPU, the op sweep's rows, the
reference steps and the held-out cases, each with its measured ms; each swept row with the real op and the part of the
step it was timed as) as JSON; `--replay FILE` measures nothing and
runs the same judgement with the code as it is now on those measurements, in a fresh home: the reference steps'
graphs are captured again (so the code that prices them is today's), the adaptation is fitted on the saved rows,
and the held-out cases are predicted before and after (`--without-real-ops [REAL_OP ...]`: the adaptation fitted
without the rows of those real ops, or of all: the sweep's depthwise convolutions, batch norms and max pools;
`--max-op-ms MS`: without the shapes a sweep capped at MS would not have run; `--record RUN` records a replay's
figures too).
`profiles/hw-bench/` keeps runs of the hosts measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from _figures import add_record_option, record_if_asked

# `perfmodel hw bench`'s verdict lines (`perfmodel.evaluation.device_steps.Verdict.lines`), by figure name
VERDICT = {"as shipped": "as_shipped", "op-sweep adaptation": "adaptation",
           "calibrated by the other steps": "calibrated", "adaptation + calibrated": "adaptation_calibrated"}
VERDICT_LINE = re.compile(r"^\s+(?P<way>.+?)\s+(?P<mape>[\d.]+) % MAPE on held-out steps(?P<applied>  <- applied)?$")
# the most the model as shipped may miss the steps by on a device it answers within its own held-out error
WITHIN_LINE = re.compile(r"within its own held-out error \(at most (?P<pct>[\d.]+) % MAPE over")
# a reference step `perfmodel hw bench` timed (`perfmodel.evaluation.device_steps.time_steps`' progress line)
STEP_LINE = re.compile(r"^steps: (?P<model>\S+) b=(?P<batch>\d+): (?P<ms>[\d.]+) ms \((?P<repeats>\d+) repeats, "
                       r"cv (?P<cv>[\d.]+)\)$")
SAVED_RUN_VERSION = 1

HELD_OUT = (  # (zoo model, batch sizes, seq_len, optimizer): none of them in `device_steps.STEP_JOBS`
    ("squeezenet1_1", (4, 8), None, "sgd"),
    ("shufflenet_v2_x1_0", (4, 8), None, "sgd"),
    ("efficientnet_b0", (2, 4), None, "adamw"),
    ("mnasnet1_0", (4, 8), None, "sgd"),
    ("resnet34", (2, 4), None, "sgd"),
    ("deit_small_patch16_224", (2, 4), None, "adamw"),
    ("gru-lm", (16, 32), 35, "adamw"),
    ("t5-small", (2, 4), 64, "adamw"),
)


def measure(cases: list, repeats: int) -> list[float]:
    import torch

    from perfmodel.jobs.build import build_job
    from perfmodel.profilers.iteration import profile_iteration

    out = []
    for spec in cases:
        stats = profile_iteration(build_job(spec, torch.device("cpu")), warmup=2, repeats=repeats)
        assert stats.iter_time_ms_median is not None, stats.error
        out.append(stats.iter_time_ms_median)
        print(f"  measured {spec.name} b={spec.batch_size}: {stats.iter_time_ms_median:.1f} ms "
              f"(cv {stats.iter_time_cv or 0:.3f})", flush=True)
    return out


def predict(cases: list) -> list[float]:
    from perfmodel.engine import EngineConfig, PredictionEngine
    from perfmodel.placement.spec import PlacementSpec

    engine = PredictionEngine.open(EngineConfig(isolate_captures=False))
    return [engine.predict(spec, PlacementSpec(accelerator="cpu", global_batch_size=spec.batch_size))["iter_time_ms"]
            for spec in cases]


def host_cpu() -> dict[str, object]:
    """What /proc/cpuinfo says of this host's CPU (model name, family, model, AVX-512), to name a saved run's host,
    and the rate at which it faults in a new large tensor's pages (`probe.first_touch_gb_s`; None: free)."""
    from perfmodel.hardware.probe import first_touch_gb_s

    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""

    def field(key: str) -> str:
        found = re.search(rf"^{key}\s*:\s*(.+)$", text, re.M)
        return found.group(1).strip() if found else ""

    return {"model_name": field("model name"), "family": field("cpu family"), "model": field("model"),
            "avx512f": "avx512f" in field("flags").split(), "machine": platform.machine(), "cores": os.cpu_count(),
            "first_touch_gb_s": first_touch_gb_s()}


def timed_steps(output: str) -> list[dict]:
    """The reference steps `perfmodel hw bench` printed it timed (`STEP_LINE`), each with its job spec."""
    from perfmodel.evaluation.device_steps import STEP_JOBS

    jobs = {job.model: job for job in STEP_JOBS}
    out = []
    for found in map(STEP_LINE.match, output.splitlines()):
        if not found or found["model"] not in jobs:
            continue
        spec = jobs[found["model"]].spec("cpu")
        if spec.batch_size != int(found["batch"]):
            raise SystemExit(f"hw bench timed {found['model']} at batch {found['batch']}, not its reference batch")
        out.append({"spec": json.loads(spec.model_dump_json()), "measured_ms": float(found["ms"]),
                    "repeats": int(found["repeats"]), "cv": float(found["cv"])})
    return out


def swept_rows(store_url: str) -> list[dict]:
    """The op sweep's rows of the CPU in the store, in the adaptation's columns, each with the real op it was
    timed as (`real_op`: `perfmodel.profilers.lowered_ops`; null for the others) and the part of its step that row is
    (`part`: fwd, dX, dW, grad; null for the others)."""
    from perfmodel.evaluation.device_ops import training_rows
    from perfmodel.regressors.adaptation import ROW_COLUMNS
    from perfmodel.store import ProfileStore

    with ProfileStore(store_url) as store:
        rows = training_rows(store.op_measurements(device="cpu"))
    real_op = [e.get("real_op") if isinstance(e, dict) else None for e in rows["extra"]]
    part = [e.get("part") if isinstance(e, dict) else None for e in rows["extra"]]
    saved = rows[[c for c in ROW_COLUMNS if c in rows and c != "part"]].assign(real_op=real_op, part=part)
    return json.loads(saved.to_json(orient="records"))


def report(cases: list, measured: list[float], before: list[float], after: list[float]) -> dict:
    """Print each case's error before and after; the MAPE and worst case of each."""
    print(f"\n{'case':<34} {'measured ms':>12} {'before ms':>10} {'err %':>7} {'after ms':>10} {'err %':>7}")
    errors_before, errors_after = [], []
    for spec, m, b, a in zip(cases, measured, before, after):
        eb, ea = 100 * (b / m - 1), 100 * (a / m - 1)
        errors_before.append(abs(eb))
        errors_after.append(abs(ea))
        case = f"{spec.name} b={spec.batch_size}"
        print(f"{case:<34} {m:>12.1f} {b:>10.1f} {eb:>+7.1f} {a:>10.1f} {ea:>+7.1f}")
    print(f"\nMAPE before hw bench: {statistics.fmean(errors_before):.1f} % (worst {max(errors_before):.0f} %)")
    print(f"MAPE after hw bench:  {statistics.fmean(errors_after):.1f} % (worst {max(errors_after):.0f} %)")
    return {"before": {"mape_pct": statistics.fmean(errors_before), "worst_pct": max(errors_before)},
            "after": {"mape_pct": statistics.fmean(errors_after), "worst_pct": max(errors_after)}}


def replay(path: Path, without_real_ops: Sequence[str] | None = None, max_op_ms: float | None = None,
           first_touch_gb_s: float | None = None) -> dict:
    """`hw bench`'s judgement, with the code as it is now, on a saved run's measurements (`--save-run`); with
    `without_real_ops`, on its rows less those of the real ops it names (depthwise convolutions, batch norms, max
    pools: `perfmodel.profilers.lowered_ops.REAL_OPS`; every one when it names none), with
    `max_op_ms`, less the shapes whose roofline × `ROOFLINE_SAFETY` exceeds it: what the judgement would be had
    the sweep not run them. The host's rate of new memory (`first_touch_gb_s`, as `hw bench` records it in the
    CPU's catalog entry) is the saved run's, else `first_touch_gb_s` when given (a run saved before runs recorded
    it, measured on its host since). Returns the figures `--record` keeps."""
    import pandas as pd

    from perfmodel.core.units import BYTES_PER_MIB
    from perfmodel.engine.op_table import promoted_device_ops_model
    from perfmodel.evaluation.device_steps import judge, own_held_out_mape_pct, predictors_for
    from perfmodel.graph import graph_for_job
    from perfmodel.hardware.catalog import load_catalog, save_local
    from perfmodel.hardware.spec import FRESH_MAP_BYTES
    from perfmodel.jobs.spec import JobSpec
    from perfmodel.lowering.ops import op_roofline_ms
    from perfmodel.profilers.microbench import ROOFLINE_SAFETY
    from perfmodel.regressors.adaptation import DeviceAdaptation, adaptations_dir
    from perfmodel.store.device_steps import DeviceStep, save_device_steps

    run = json.loads(path.read_text())
    if run.get("version") != SAVED_RUN_VERSION:
        raise SystemExit(f"{path}: not a saved hw bench run of version {SAVED_RUN_VERSION}")
    print(f"replaying {path} (host {run['host'].get('model_name')}, family {run['host'].get('family')} model "
          f"{run['host'].get('model')}, measured {run['measured_at']}) in {os.environ['PERFMODEL_HOME']}", flush=True)
    rate = run["host"].get("first_touch_gb_s", first_touch_gb_s)
    if rate is not None:
        save_local(load_catalog()["cpu"].model_copy(update={"first_touch_gb_s": rate}))
        print(f"new memory at {rate:g} GB/s (tensors of {FRESH_MAP_BYTES // BYTES_PER_MIB} MiB or more)", flush=True)
    cases = [JobSpec.model_validate(case["spec"]) for case in run["held_out"]]
    measured = [case["measured_ms"] for case in run["held_out"]]
    before = predict(cases)
    catalog = load_catalog()
    model, ref = promoted_device_ops_model()
    rows = pd.DataFrame(run["rows"])
    real = rows["real_op"].notna() if "real_op" in rows else pd.Series(False, index=rows.index)
    if without_real_ops is not None:
        if without_real_ops:
            real &= rows["real_op"].isin(without_real_ops)
        print(f"left out the {int(real.sum())} rows of real ops ({', '.join(without_real_ops) or 'all'})")
        rows = rows[~real]
    if max_op_ms is not None:
        slow = op_roofline_ms(rows.assign(device="cpu"), catalog) * ROOFLINE_SAFETY > max_op_ms
        print(f"left out the {int(slow.sum())} rows whose roofline x {ROOFLINE_SAFETY:g} exceeds {max_op_ms:g} ms")
        rows = rows[~slow]
    adaptation = DeviceAdaptation.fit(model, rows.drop(columns=["real_op"], errors="ignore"), catalog,
                                      device="cpu")  # its classes only

    def reference_step(saved: dict) -> DeviceStep:  # its graph captured again: the code that prices it is today's
        spec = JobSpec.model_validate(saved["spec"])
        return DeviceStep(accelerator="cpu", spec=spec, graph_json=graph_for_job(spec).to_json(),
                          measured_ms=saved["measured_ms"], repeats=saved["repeats"], cv=saved["cv"],
                          measured_at=run["measured_at"], torch_version=run.get("torch_version", ""))

    steps = tuple(map(reference_step, run["steps"]))
    verdict = judge(steps, catalog["cpu"], predictors_for("cpu", adaptation, catalog), own_held_out_mape_pct("cpu"))
    print(f"{len(steps)} reference steps, {sum(adaptation.rows_per_class.values())} swept rows ({ref} adapted), each "
          f"step predicted without its own measurement:")
    for line in verdict.lines():
        print(line)
    if verdict.adapt:
        adaptation.save(adaptations_dir() / "cpu")
    if verdict.calibrate:
        save_device_steps("cpu", steps)
    return {"cases": len(cases), **verdict_figures("\n".join(verdict.lines())),
            **report(cases, measured, before, predict(cases))}


def verdict_figures(output: str) -> dict:
    """The held-out verdict `hw bench` printed (`VERDICT_LINE`, `WITHIN_LINE`) as figures."""
    verdict = [m for m in map(VERDICT_LINE.match, output.splitlines()) if m and m["way"] in VERDICT]
    within = WITHIN_LINE.search(output)
    return {"held_out_steps_mape_pct": {VERDICT[m["way"]]: float(m["mape"]) for m in verdict},
            "applied": next((VERDICT[m["way"]] for m in verdict if m["applied"]), None),
            "within_pct": float(within["pct"]) if within else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=240.0, help="hw bench's op sweep budget")
    parser.add_argument("--steps-budget-s", type=float, default=150.0, help="hw bench's whole-step budget")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats of each held-out step")
    parser.add_argument("--home", type=Path, help="PERFMODEL_HOME to bench in (default: a new temporary one)")
    parser.add_argument("--save-run", type=Path, metavar="FILE", help="write what this run measured as JSON")
    parser.add_argument("--replay", type=Path, metavar="FILE",
                        help="measure nothing: judge a saved run (--save-run) with the code as it is now")
    parser.add_argument("--without-real-ops", nargs="*", metavar="REAL_OP",
                        help="with --replay: leave out the rows of these real ops (e.g. max_pool3x3s2; none named: "
                             "every one: depthwise convolutions, batch norms, max pools)")
    parser.add_argument("--max-op-ms", type=float,
                        help="with --replay: leave out the rows whose roofline x 3 exceeds this (hw bench's cap)")
    parser.add_argument("--first-touch-gb-s", type=float,
                        help="with --replay of a run saved without it: the rate its host faults in new 64 MiB "
                             "tensors (`perfmodel hw probe --json`, on that host)")
    add_record_option(parser)
    args = parser.parse_args(argv)
    home = args.home or Path(tempfile.mkdtemp(prefix="perfmodel-hw-bench-"))
    os.environ["PERFMODEL_HOME"] = str(home)
    os.environ.pop("PERFMODEL_STORE_URL", None)
    if (args.without_real_ops is not None or args.max_op_ms is not None or args.first_touch_gb_s is not None) \
            and not args.replay:
        parser.error("--without-real-ops, --max-op-ms and --first-touch-gb-s go with --replay")
    if args.replay:
        record_if_asked(args, "hw_bench", replay(args.replay, args.without_real_ops, args.max_op_ms,
                                                 args.first_touch_gb_s))
        return 0
    from typer.testing import CliRunner

    from perfmodel.cli.main import app
    from perfmodel.jobs.spec import JobSpec

    cases = [JobSpec.from_options(zoo=model, batch_size=b, seq_len=seq_len, optimizer=optimizer)
             for model, batches, seq_len, optimizer in HELD_OUT for b in batches]
    print(f"home {home}; {len(cases)} held-out cases", flush=True)
    measured_at = datetime.now(timezone.utc).isoformat()
    measured = measure(cases, args.repeats)
    before = predict(cases)
    started = time.perf_counter()
    store_url = f"sqlite:///{home / 'bench.db'}"
    result = CliRunner().invoke(app, ["hw", "bench", "--device", "cpu", "--budget-s", str(args.budget_s),
                                      "--steps-budget-s", str(args.steps_budget_s), "--store", store_url])
    print(result.output, flush=True)
    if result.exit_code != 0:
        print(f"hw bench failed ({result.exit_code})", file=sys.stderr)
        return 1
    print(f"hw bench took {time.perf_counter() - started:.0f} s")
    if args.save_run:
        import torch

        args.save_run.parent.mkdir(parents=True, exist_ok=True)
        args.save_run.write_text(json.dumps({
            "version": SAVED_RUN_VERSION, "host": host_cpu(), "measured_at": measured_at,
            "torch_version": torch.__version__,
            "held_out": [{"spec": json.loads(spec.model_dump_json()), "measured_ms": m}
                         for spec, m in zip(cases, measured)],
            "steps": timed_steps(result.output), "rows": swept_rows(store_url)}, indent=1) + "\n")
        print(f"saved the run's measurements in {args.save_run} (`--replay` judges them again)")
    figures = report(cases, measured, before, predict(cases))
    record_if_asked(args, "hw_bench", {"cases": len(cases), **verdict_figures(result.output), **figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())

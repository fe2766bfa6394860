"""Does `perfmodel hw bench` help on this machine? Whole training steps of jobs it never times, predicted before and
after it, against their measured steps.

    .venv/bin/python bench/hw_bench.py [--budget-s S] [--steps-budget-s S] [--home DIR]

In a fresh PERFMODEL_HOME (`--home`, default a temporary folder): times 16 held-out cases (8 small zoo jobs none of
which `hw bench` runs, at two batch sizes each; warm-up, then the median of timed repeats), predicts each with the
prediction engine as shipped, runs `perfmodel hw bench --device cpu` (op sweep + whole reference steps + the held-out
judgement of what to keep), predicts again with a new engine, and prints the MAPE and worst case before and after,
per case and overall. The judged target: after, within 15 % and never worse than before. `--record [RUN]` records
hw bench's held-out verdict and the MAPE before and after for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _figures import add_record_option, record_if_asked

# `perfmodel hw bench`'s verdict lines (`perfmodel.evaluation.device_steps.Verdict.lines`), by figure name
VERDICT = {"as shipped": "as_shipped", "op-sweep adaptation": "adaptation",
           "calibrated by the other steps": "calibrated", "adaptation + calibrated": "adaptation_calibrated"}
VERDICT_LINE = re.compile(r"^\s+(?P<way>.+?)\s+(?P<mape>[\d.]+) % MAPE on held-out steps(?P<applied>  <- applied)?$")
# the most the model as shipped may miss the steps by on a device it answers within its own held-out error
WITHIN_LINE = re.compile(r"within its own held-out error \(at most (?P<pct>[\d.]+) % MAPE over")

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=240.0, help="hw bench's op sweep budget")
    parser.add_argument("--steps-budget-s", type=float, default=150.0, help="hw bench's whole-step budget")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats of each held-out step")
    parser.add_argument("--home", type=Path, help="PERFMODEL_HOME to bench in (default: a new temporary one)")
    add_record_option(parser)
    args = parser.parse_args(argv)
    home = args.home or Path(tempfile.mkdtemp(prefix="perfmodel-hw-bench-"))
    os.environ["PERFMODEL_HOME"] = str(home)
    os.environ.pop("PERFMODEL_STORE_URL", None)
    from typer.testing import CliRunner

    from perfmodel.cli.main import app
    from perfmodel.jobs.spec import JobSpec

    cases = [JobSpec.from_options(zoo=model, batch_size=b, seq_len=seq_len, optimizer=optimizer)
             for model, batches, seq_len, optimizer in HELD_OUT for b in batches]
    print(f"home {home}; {len(cases)} held-out cases", flush=True)
    measured = measure(cases, args.repeats)
    before = predict(cases)
    started = time.perf_counter()
    result = CliRunner().invoke(app, ["hw", "bench", "--device", "cpu", "--budget-s", str(args.budget_s),
                                      "--steps-budget-s", str(args.steps_budget_s),
                                      "--store", f"sqlite:///{home / 'bench.db'}"])
    print(result.output, flush=True)
    if result.exit_code != 0:
        print(f"hw bench failed ({result.exit_code})", file=sys.stderr)
        return 1
    print(f"hw bench took {time.perf_counter() - started:.0f} s")
    after = predict(cases)
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
    verdict = [m for m in map(VERDICT_LINE.match, result.output.splitlines()) if m and m["way"] in VERDICT]
    within = WITHIN_LINE.search(result.output)
    record_if_asked(args, "hw_bench", {
        "cases": len(cases),
        "held_out_steps_mape_pct": {VERDICT[m["way"]]: float(m["mape"]) for m in verdict},
        "applied": next((VERDICT[m["way"]] for m in verdict if m["applied"]), None),
        "within_pct": float(within["pct"]) if within else None,
        "before": {"mape_pct": statistics.fmean(errors_before), "worst_pct": max(errors_before)},
        "after": {"mape_pct": statistics.fmean(errors_after), "worst_pct": max(errors_after)}})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The fleet calibration on real runs: how much observing some jobs helps the answers for others (Lambda's public
PyTorch runs: 8 DeepLearningExamples models, 27 GPUs, TF32 and AMP, 1-16 GPUs in a node).

    .venv/bin/python bench/fleet.py [--datasets DIR] [--cache FILE.parquet] [--graph-cache DIR] [--draws N]
        [--served OUT-family.csv OUT-chip.csv [--device-bias 1.3 ...]] [--job-prior SD] [--chip-prior SD]

Two protocols (`perfmodel.evaluation.fleet`), every prediction of a run whose own measurements were not used:
- same GPU: on each GPU and math mode (the fleet's: a half model with fp32 master weights, `fp16-master`, shares
  autocast's device effects, `amp`: `device_math`), k models observed (k = 0, 1, 2, 4; up to `--draws` random
  choices of k), the other models' runs on that GPU predicted at 1 and at 2-16 GPUs;
- the job elsewhere: every other model observed on every GPU, the asked model on k other GPUs (random), its runs
  on a GPU it was not observed on predicted.
Prints MAPE against k (one GPU, 2-16 GPUs), the 80 % interval's coverage, and the same-GPU table per GPU and math
mode. The interval is the fleet's own predictive spread on the composed frame, and on the served answers the one the
service gives (the served band, its log width scaled by the calibration's `interval_scale`). `--served` runs the
same-GPU protocol again on what the service answered (the held-out predictions
`bench/real_runs.py --out OUT.csv` writes, with the learned whole-step stage fitted without the run's family or
chip): the case of a scheduler posting some jobs' throughputs on a GPU and asking for others; and again with every
measured step `--device-bias` times longer (1.3 by default), as on a GPU the model is off on by a constant (a
generation it never saw): how much of that the fleet learns from k other models. On each served file it also
prints what the best single share of the observed models' mean error, applied to the others and chosen on the same
runs, would give (`shrunk_other_models`): a ceiling for any such rule. The composed frame
(`--cache`) is shared with bench/real_runs.py: composing every run takes ~40 min.
The fleet's priors were set by looking at these runs: the figures are not a hold-out of that choice. `--job-prior`
and `--chip-prior` run every protocol with other standard deviations (what `PERFMODEL_FLEET_JOB_PRIOR` and
`PERFMODEL_FLEET_CHIP_PRIOR` set in the service), to see what a setting costs and buys (recorded only under a run
name: `--record RUN`).
`--record [RUN]` records both protocols' MAPE against k for docs/accuracy.md (bench/_figures.py).
Data: Lambda, lambdal/deeplearning-benchmark (read in place, never copied).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from _figures import add_record_option, figure_key, record_if_asked

from perfmodel.calibration.fleet import FleetPriors
from perfmodel.evaluation.fleet import error_floors, fleet_frame, job_elsewhere, same_gpu, shrunk_other_models, summary
from perfmodel.evaluation.real_runs import read_composed, steady_steps
from perfmodel.hardware.catalog import load_catalog
from perfmodel.settings import get_settings


def composed(datasets: Path, cache: Path | None, graph_cache: Path | None) -> pd.DataFrame:
    cached = read_composed(cache)
    if cached is not None:
        return cached
    from perfmodel.evaluation.real_runs import composed_frame, disk_graphs, lambda_runs
    from perfmodel.predictor.placed import PlacementPredictor

    predictor = PlacementPredictor.load(graphs=disk_graphs(graph_cache) if graph_cache else None)
    predictor.set_whole_step(None)
    frame = composed_frame(lambda_runs(datasets / "lambda"), predictor, progress=lambda m: print("  " + m, flush=True))
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(cache)
    return frame


def served_frame(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    """`frame` (a fleet frame) with each configuration's step replaced by its served answer from `path`
    (bench/real_runs.py --out: `key`, `predicted_ms` and its band), so that the fleet calibrates what the service
    answered and its interval is the service's."""
    from perfmodel.evaluation.real_runs import run_key

    answers = pd.read_csv(path)[["key", "predicted_ms", "low_ms", "high_ms"]].rename(
        columns={"low_ms": "served_low_ms", "high_ms": "served_high_ms"})
    keyed = frame.assign(key=[run_key(r) for r in frame.itertuples(index=False)])
    served = keyed.merge(answers, on="key")
    return served.assign(placement_ms=served.predicted_ms,
                         log_ratio=np.log(served.measured_ms / served.predicted_ms),
                         communication_share=(served.communication_ms / served.predicted_ms).clip(0.0, 1.0))


def off_by(frame: pd.DataFrame, bias: float) -> pd.DataFrame:
    """`frame` (a served fleet frame) with every measured step `bias` times longer: each GPU as if the model were
    off on it by that constant on top of its real error."""
    return frame.assign(measured_ms=frame.measured_ms * bias, log_ratio=frame.log_ratio + np.log(bias))


def by_k(table: pd.DataFrame) -> dict:
    """`summary(rows)` (per k), for docs/figures."""
    return {f"k{k}": {"one_gpu_mape_pct": r.mape_1gpu_pct, "multi_gpu_mape_pct": r.mape_ngpu_pct,
                      "coverage_80_pct": r.coverage_80_pct, "runs": int(r.runs)} for k, r in table.iterrows()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=Path, default=get_settings().datasets_dir)
    parser.add_argument("--cache", type=Path, help="the composed runs' Parquet file (bench/real_runs.py --cache)")
    parser.add_argument("--graph-cache", type=Path, help="keep captured graphs (IR JSON) in this folder")
    parser.add_argument("--draws", type=int, default=20, help="random choices of k observed models per GPU")
    parser.add_argument("--served", type=Path, nargs="+", metavar="HELD_OUT.csv",
                        help="also run the same-GPU protocol on these served answers (bench/real_runs.py --out's "
                             "held-out predictions, e.g. OUT-chip.csv: a GPU whose chip the stage never saw)")
    parser.add_argument("--device-bias", type=float, nargs="*", default=[1.3], metavar="FACTOR",
                        help="with --served, also every measured step this many times longer [1.3]")
    parser.add_argument("--job-prior", type=float, default=FleetPriors().job, metavar="SD",
                        help=f"the job effect's prior standard deviation (log) [{FleetPriors().job}]")
    parser.add_argument("--chip-prior", type=float, default=FleetPriors().chip, metavar="SD",
                        help=f"the chip effect's prior standard deviation (log) [{FleetPriors().chip}]")
    add_record_option(parser)
    args = parser.parse_args(argv)
    priors = FleetPriors(job=args.job_prior, chip=args.chip_prior)
    if not (priors.job > 0 and priors.chip > 0):
        parser.error("--job-prior and --chip-prior must be positive")
    if priors != FleetPriors() and args.record == "":
        parser.error("--record without a RUN name records the shipped priors' figures: name the run (--record RUN)")
    if priors != FleetPriors():
        print(f"fleet priors: job {priors.job:g}, chip {priors.chip:g} (shipped: job {FleetPriors().job:g}, "
              f"chip {FleetPriors().chip:g})")
    if not (args.datasets / "lambda").is_dir() and not (args.cache and args.cache.is_file()):
        print(f"no Lambda runs at {args.datasets / 'lambda'}: nothing to judge", file=sys.stderr)
        return 2
    started = time.perf_counter()
    frame = composed(args.datasets, args.cache, args.graph_cache)
    steady, left_out = steady_steps(frame)
    print("\n".join(left_out))
    frame = fleet_frame(frame[steady & (frame.source == "lambda")], load_catalog())
    print(f"{len(frame)} configurations of {frame.model.nunique()} models on {frame.accelerator.nunique()} GPUs")

    rows = same_gpu(frame, draws=args.draws, priors=priors)
    print("\n## Same GPU: k other models observed on it, the rest predicted\n")
    recorded = {"same_gpu": summary(rows)}
    print(recorded["same_gpu"].round(1).to_string())
    print("\nper math mode:\n")
    print(summary(rows, ("math", "k")).round(1).to_string())
    table = summary(rows, ("accelerator", "math", "k")).mape_1gpu_pct.unstack("k").round(1)
    print("\none-GPU MAPE per GPU and math mode against k:\n")
    print(table.to_string())

    floors = error_floors(frame)
    print("\n## How far per-device factors can go (one GPU, fitted in sample: a floor, not a hold-out)\n")
    print(f"  none: {summary(rows[rows.k == 0]).mape_1gpu_pct.iloc[0]:.1f} %; a factor per (GPU, math) and per "
          f"(model, math), the asked model's own included: {floors['gpu_and_model']:.1f} %; per (GPU, math) one "
          f"factor per op group, the asked model included: {floors['op_groups_per_gpu']:.1f} %; the mean error of "
          f"every other model on the GPU, no prior: {floors['other_models_mean']:.1f} %")
    recorded_floors = floors

    recorded_ceilings: dict[str, pd.DataFrame] = {}
    for path in args.served or ():
        served = served_frame(frame, path)
        rows = same_gpu(served, draws=args.draws, priors=priors)
        print(f"\n## Same GPU on the served answers of {path.name} ({len(served)} configurations): k other models "
              f"observed, the rest predicted\n")
        table = summary(rows)
        print(table.round(1).to_string())
        name = f"same_gpu_served_{path.stem.rsplit('-', 1)[-1]}"
        recorded[name] = table
        ceiling = shrunk_other_models(served, draws=args.draws)
        print("\n  one share of the observed models' mean error applied to the others, the best share per k chosen on "
              "these runs (a ceiling for any such rule, not a hold-out):\n")
        print(ceiling.round(2).to_string())
        recorded_ceilings[name] = ceiling
        for bias in args.device_bias:
            rows = same_gpu(off_by(served, bias), draws=args.draws, priors=priors)
            print(f"\n  the same with every measured step {bias:g}x the served answer's error (a GPU the model is "
                  f"off on by a constant, as a new generation may be):\n")
            table = summary(rows)
            print(table.round(1).to_string())
            recorded[f"{name}_off_{figure_key(f'{bias:g}x')}"] = table

    rows = job_elsewhere(frame, priors=priors)
    print("\n## The job elsewhere: every other model observed everywhere, the asked one on k other GPUs\n")
    recorded["job_elsewhere"] = summary(rows)
    print(recorded["job_elsewhere"].round(1).to_string())
    print("\nper math mode:\n")
    print(summary(rows, ("math", "k")).round(1).to_string())
    coverage = pd.concat(list(recorded.values())).coverage_80_pct
    served_tables = [table for name, table in recorded.items() if name.startswith("same_gpu_served_")
                     and "_off_" not in name]
    served_coverage = pd.concat(served_tables).coverage_80_pct if served_tables else pd.Series([float("nan")])
    record_if_asked(args, "fleet", {**{name: by_k(table) for name, table in recorded.items()},
                                    "coverage_80_pct": {"min": coverage.min(), "max": coverage.max()},
                                    "served_coverage_80_pct": {"min": served_coverage.min(),
                                                               "max": served_coverage.max()},
                                    "one_gpu_floor_mape_pct": recorded_floors,
                                    "shrunk_other_models": {name: {f"k{k}": {"best_shrink": r.best_shrink,
                                                                             "best_mape_1gpu_pct": r.best_mape_1gpu_pct}
                                                                   for k, r in table.iterrows()}
                                                            for name, table in recorded_ceilings.items()}})
    print(f"\ndone in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Whole-model training steps on GPUs held out of training (leave-one-GPU-out by chip), split by math mode.

Run (after importing the public op measurements into a store, ~1 min):

    for s in neusight vidur deepbench llmservingsim phantora; do
        .venv/bin/perfmodel import $s ../shared/datasets/$s --store sqlite:////tmp/gpu-ops.db; done
    .venv/bin/python bench/whole_model.py --store sqlite:////tmp/gpu-ops.db [--sources ...] [--vtrain-rows 60]

For every chip that has whole-model measurements (`perfmodel.evaluation.whole_model`: NeuSight's training labels,
adaptdl's one-T4 steps, vTrain's data-parallel Megatron runs), the per-op device model is fitted on the op
measurements of every other chip and the measured steps of that chip are predicted through the same code path as
`perfmodel predict` (math modes, roofline bounds, optimizer and autocast rows). Prints every measurement, then
MAPE by math mode, by chip and by source. `--before` fits as the previous model was (neusight, vidur, deepbench
only; without the tensor-core and peak-per-watt features) and charges no host dispatch time; the math modes, the
roofline bounds and the optimizer rows are today's in both. `--whole-step` corrects every composed step with the
promoted whole-step stage, as the service does (the stage was fitted on Lambda's runs, which include A100 and V100
runs but none of these measurements). `--record [RUN]` records the MAPE by math mode, chip, source and model for
docs/accuracy.md (bench/_figures.py); the doc quotes several runs (`--record before`, `--record whole_step`, ...:
docs/figures/whole_model-*.json name each run's command).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
from _figures import add_record_option, figure_key, record_if_asked

from perfmodel.evaluation.device_ops import chip_of, training_rows
from perfmodel.evaluation.whole_model import (
    adaptdl_measurements,
    neusight_measurements,
    predict_measurements,
    summary,
    vtrain_measurements,
)
from perfmodel.hardware.catalog import load_catalog
from perfmodel.placement.iteration import load_params
from perfmodel.predictor.gpu_iteration import DevicePredictor
from perfmodel.predictor.whole_step import WholeStepStage
from perfmodel.regressors.device_ops import DeviceOpRegressor
from perfmodel.settings import get_settings
from perfmodel.store import ProfileStore

ALL_SOURCES = "neusight,vidur,deepbench,llmservingsim,phantora"
BEFORE_SOURCES = "neusight,vidur,deepbench"
HOST_US_GRID = (0, 4, 8, 12, 16, 20, 25, 30, 40)
NEW_FEATURES = ("tensor_math", "log_peak_per_watt")  # what issue 11 added to the device model's features


def groups(table: pd.DataFrame) -> dict:
    """A `summary` table, one group per key (nested for two keys), for docs/figures."""
    out: dict = {}
    for key, r in table.iterrows():
        keys = [figure_key(k) for k in (key if isinstance(key, tuple) else (key,))]
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = {"n": int(r.n), "mape_pct": r.mape, "median_ape_pct": r.median_ape, "bias": r.bias}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="store URL holding the imported op measurements")
    parser.add_argument("--datasets", type=Path, default=get_settings().datasets_dir)
    parser.add_argument("--sources", default=None, help=f"import sources to fit on (default {ALL_SOURCES})")
    parser.add_argument("--before", action="store_true", help="fit as the previous model: "
                        f"{BEFORE_SOURCES}, no tensor-core or peak-per-watt feature, no host dispatch time")
    parser.add_argument("--vtrain-rows", type=int, default=80, help="vTrain data-parallel rows (of 240) to predict")
    parser.add_argument("--max-rows-per-class", type=int, default=20000)
    parser.add_argument("--out", type=Path, help="write every prediction to this CSV")
    parser.add_argument("--host-us", type=float, help="host dispatch cost per kernel, us (default: the shipped "
                        "HOST_MS_PER_KERNEL)")
    parser.add_argument("--fit-host", action="store_true", help="fit the host dispatch cost on vTrain's rows")
    parser.add_argument("--whole-step", action="store_true",
                        help="correct every composed step with the promoted whole-step stage, as the service does")
    add_record_option(parser)
    args = parser.parse_args(argv)

    sources = args.sources or (BEFORE_SOURCES if args.before else ALL_SOURCES)
    catalog = load_catalog()
    ops = training_rows(ProfileStore(args.store).op_measurements(source=sources.split(","), extra=False))
    if ops.empty:
        parser.error(f"the store has no op measurements of {sources}")
    ops = ops.assign(chip=ops.device.map(chip_of))
    print(f"{len(ops)} op rows of {ops.chip.nunique()} chips from {sources}")

    measurements = [*neusight_measurements(args.datasets / "neusight", catalog),
                    *adaptdl_measurements(args.datasets / "adaptdl"),
                    *vtrain_measurements(args.datasets / "vtrain", args.vtrain_rows)]
    print(f"{len(measurements)} whole-model measurements")

    def predictor_for_chip(chip: str) -> DevicePredictor:
        train = ops[ops.chip != chip]
        assert chip not in set(train.chip), "leak: the held-out chip is in the training rows"
        regressor = DeviceOpRegressor(max_rows_per_class=args.max_rows_per_class, calibration_rows=1500,
                                      exclude_features=NEW_FEATURES if args.before else ())
        return DevicePredictor(regressor.fit(train, catalog), f"logo-without-{chip}", catalog)

    start = time.perf_counter()
    predictors: dict = {}
    stage = WholeStepStage.load() if args.whole_step else None
    if args.whole_step and stage is None:
        parser.error("--whole-step: the registry promotes no whole-step stage")

    def run(which: list, host_ms: float | None) -> pd.DataFrame:
        return predict_measurements(which, predictor_for_chip, params=load_params("default"), predictors=predictors,
                                    host_ms_per_kernel=host_ms, whole_step=stage,
                                    progress=lambda s: print(f"  [{time.perf_counter() - start:6.0f} s] {s}",
                                                             flush=True))

    host_ms = args.host_us / 1e3 if args.host_us is not None else 0.0 if args.before else None
    if args.fit_host:  # the host dispatch cost per kernel, on vTrain's data-parallel runs only
        vtrain = [m for m in measurements if m.source == "vtrain"]
        grid = {us: run(vtrain, us / 1e3).ape.mean() for us in HOST_US_GRID}
        print("host us per kernel -> vTrain MAPE: " + ", ".join(f"{us}: {e:.1f} %" for us, e in grid.items()))
        host_ms = min(grid, key=grid.get) / 1e3
        print(f"fitted: {host_ms * 1e3:g} us per kernel (vTrain's figures below are not held out for it)")
    results = run(measurements, host_ms)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 500)
    failed = results[results.error.notna()]
    if len(failed):
        print(f"\n{len(failed)} not predicted:")
        print(failed[["source", "model", "device", "error"]].drop_duplicates("model").to_string(index=False))
    print("\nper measurement:")
    print(results[results.error.isna()].drop(columns=["error"]).round(1).to_string(index=False))
    recorded: dict = {}
    for name, by in (("precision", ["precision"]), ("chip", ["chip"]), ("source", ["source", "precision"]),
                     ("model", ["source", "model"])):
        print(f"\nby {', '.join(by)}:")
        print(summary(results, by).round(3).to_string())
        recorded[name] = groups(summary(results, by))
    ok = results[results.error.isna()]
    print(f"\nall: {len(ok)} measurements, MAPE {ok.ape.mean():.1f} %, median {ok.ape.median():.1f} %, "
          f"worst chip {summary(results, ['chip']).mape.idxmax()} "
          f"({summary(results, ['chip']).mape.max():.1f} %)")
    recorded["all"] = {"n": len(ok), "mape_pct": ok.ape.mean(), "median_ape_pct": ok.ape.median(),
                       "worst_chip": summary(results, ["chip"]).mape.idxmax(),
                       "worst_chip_mape_pct": summary(results, ["chip"]).mape.max()}
    record_if_asked(args, "whole_model", recorded)
    if args.out:
        results.to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Real training runs held out: the learned whole-step stage judged on Lambda's public PyTorch runs (TF32 / AMP,
27 GPUs, 1-16 GPUs in a node), leave one model family out and leave one chip out.

    .venv/bin/python bench/real_runs.py [--datasets DIR] [--cache FILE.parquet] [--stage NAME] [--write] [--promote]

Steps: every successful run of a zoo model on a catalog GPU (repeats merged) is composed once through the serving
path without the stage (kernel sum per device + placement model), then for each hold-out group a stage is fitted
on the other groups' one-GPU runs and the group's runs are predicted through the serving path with it
(`PlacementPredictor.predict`: the stage corrects one device's compute, the placement model adds communication).
Each held-out run is predicted for the PyTorch it ran on (the stage's offset of its version, learned without the
group; the service answers for the newest, PyTorch 1.13 in NGC 22.09), and the runs on the newest are printed
apart: there the held-out answer is the served one.
Prints MAPE per math mode and GPU count (one GPU; 2-16), the worst GPU, the 80 % interval's coverage and the
n-GPU / 1-GPU scaling ratio's error, for the composed prediction ("before") and each hold-out, and what bandwidth
alone buys (A100 40 GB against 80 GB: measured, composed, served with the chip held out). `--stage`: the
stage to fit, `device-whole-step` (default: a spec-sheet device effect and a level per measured model) or
`xgb-whole-step` (boosted trees over the composition features). `--write` fits the stage on every run and saves it
as its next version in the registry; `--promote` promotes it (role whole-step).
The placement model's replica jitters (`IterationParams.dp_jitter`: data parallelism waits for its slowest replica;
`dp_jitter_varying` and `dp_jitter_steady` for jobs whose steps vary, or do not: `JobSpec.steps_vary`) are fitted on
the data-parallel runs' n-GPU / 1-GPU ratios, each kind on the runs of models whose reference implementation is of
it (`ZooEntry.reference_steps_vary`), without the held-out group in each fold; the bench prints them fitted on every
run and held out by family and by chip (against one jitter for every job), with the 80 % band of the n-GPU / 1-GPU
ratio they leave (`IterationParams.scaling_band_log`: multi-GPU intervals add it to one GPU's band in quadrature;
fitted without the held-out group too), and `--write-jitter` stores them fitted on every run as the default
(perfmodel/placement/iteration_params.json). `--record [RUN]` records the
headline figures for docs/accuracy.md (bench/_figures.py).
`--no-p2p-suite v1` also composes that suite's data-parallel runs again as if their GPUs had no peer-to-peer (later
versions of Lambda's script export NCCL_P2P_DISABLE=1; the runs do not record which version ran them) and prints
the n-GPU / 1-GPU ratio's MAPE per suite both ways, the jitter held out by family as above (a sensitivity, not a
headline figure: which runs had P2P off is not known).
It prints how far the stage fitted on every one-GPU run still answers each GPU's own runs (not a held-out figure:
what its spec-sheet device effect cannot express about a GPU it saw). It also counts the one-GPU runs measured
faster than the floor no answer goes below (Σ of each kernel at the peak
of its math or at the memory bandwidth, for the work the graph counts), and scores the answers and the band on them
and on the rest. And how closely the runs repeat themselves (`repeat_spread`: each configuration measured more
than once, every measurement answered by the geometric mean of its others, within a suite and across suites): what
an answer that knows nothing of the server could reach at best.
Data: Lambda, lambdal/deeplearning-benchmark (read in place, never copied).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from _figures import add_record_option, figure_key, record_if_asked

from perfmodel.core.accuracy import throughput_ape
from perfmodel.evaluation.gpu_report import (
    gpu_accuracy,
    group_table,
    headline,
    headline_line,
    mode_table,
    write_gpu_report,
)
from perfmodel.evaluation.real_runs import (
    DEFAULT_STAGE,
    STAGES,
    disk_graphs,
    fit_dp_jitter,
    fit_replica_jitters,
    fit_stage,
    jitter_ratio_ape,
    jitter_rows,
    lambda_runs,
    on_own_software,
    predict_from_frame,
    recomposed_without_p2p,
    repeat_spread,
    row_jitters,
    run_key,
    scaling_band_log,
)
from perfmodel.importers.lambda_runs import read_lambda
from perfmodel.placement.iteration import IterationParams, dump_params, params_path
from perfmodel.regressors.whole_step_device import version_key
from perfmodel.settings import get_settings


def show(frame: pd.DataFrame, title: str) -> None:
    print(f"\n## {title}\n\n{headline_line(frame)}\n\n{mode_table(frame)}\n\n{group_table(frame, 'family')}\n\n"
          f"{group_table(frame, 'chip')}")


def newest_software(frame: pd.DataFrame) -> pd.DataFrame:
    """The runs on the newest PyTorch of the data (what the service answers for: its step has no software
    offset, served and held-out predictions are the same)."""
    versions = [v for v in frame.get("pytorch_version", pd.Series(dtype=str)).fillna("").unique() if v]
    if not versions:
        return frame.iloc[:0]
    newest = max(versions, key=version_key)
    return frame[frame.pytorch_version == newest]


def figures(frame: pd.DataFrame) -> dict:
    """What `show` prints of one frame, for docs/figures: the headline and the per-family MAPE."""
    h = headline(frame)
    out = {"one_gpu_mape_pct": 100 * h["mape_1gpu"], "multi_gpu_mape_pct": 100 * h["mape_multi"],
           "one_gpu_median_ape_pct": 100 * h["median_1gpu"], "multi_gpu_median_ape_pct": 100 * h["median_multi"],
           "worst_gpu": h["worst_gpu"], "worst_gpu_mape_pct": 100 * h["worst_gpu_mape"],
           "scaling_ratio_mape_pct": 100 * h["scaling_ratio_mape"]}
    if "coverage" in h:
        out["coverage"] = h["coverage"]
    ape = pd.Series(throughput_ape(frame.predicted_ms, frame.measured_ms), index=frame.index)
    by_family = ape.groupby(frame.family)
    out["family_mape_pct"] = {figure_key(k): 100 * v for k, v in by_family.mean().items()}
    out["family_configurations"] = {figure_key(k): int(v) for k, v in by_family.size().items()}
    return out


def show_repeat_spread(datasets: Path) -> dict:
    """How closely the runs repeat themselves (`repeat_spread`): the floor of any answer that knows nothing of the
    server, printed and returned for the record."""
    spread = repeat_spread(read_lambda(datasets / "lambda"))
    print("\n## How closely the runs repeat (each repeat of a configuration answered by the geometric mean of its "
          "others)\n")
    for name, label in (("same_software", "same suite (container)"), ("any_software", "any suite")):
        f = spread[name]
        print(f"  {label:22s} one GPU {f['one_gpu_mape_pct']:.1f} % (median {f['one_gpu_median_ape_pct']:.1f} %, "
              f"{f['one_gpu_runs']} runs); 2-16 GPUs {f['multi_gpu_mape_pct']:.1f} % (median "
              f"{f['multi_gpu_median_ape_pct']:.1f} %, {f['multi_gpu_runs']} runs)")
    return spread


def replica_jitter(composed: pd.DataFrame) -> dict:
    """The replica jitters fitted on every data-parallel run (`fit_replica_jitters`: one for a job of unknown kind,
    one for steps that vary, one for steps that do not), and held out by family and by chip: the n-GPU / 1-GPU
    ratio's MAPE of the held-out group with the jitters fitted without it, against one jitter for every job and
    against none (printed and returned)."""
    rows = jitter_rows(composed)
    jitters = fit_replica_jitters(rows)
    out: dict = {"fitted_on_all": jitters["dp_jitter"], "steady": jitters["dp_jitter_steady"],
                 "varying": jitters["dp_jitter_varying"], "runs": len(rows),
                 "steady_runs": int((rows.steps_vary == 0).sum()), "varying_runs": int((rows.steps_vary > 0).sum())}
    out["scaling_band_log"] = list(scaling_band_log(rows, row_jitters(rows, jitters)))
    print(f"\n## The wait for the slowest replica (data parallel, {len(rows)} runs with a one-GPU twin)\n\n"
          f"replica jitter fitted on every run: {out['fitted_on_all']:.4f} (a job of unknown kind); on the "
          f"{out['varying_runs']} runs of models whose steps vary: {out['varying']:.4f}; on the "
          f"{out['steady_runs']} whose steps do not: {out['steady']:.4f}; the n-GPU / 1-GPU ratio's 80 % band "
          f"with them (log): {out['scaling_band_log'][0]:+.3f} / {out['scaling_band_log'][1]:+.3f}")
    for by in ("family", "chip"):
        out[by] = {"scaling_ratio_mape_pct": 100 * float(held_ratio_ape(rows, by).ape.mean()),
                   "one_jitter_pct": 100 * float(held_ratio_ape(rows, by, kinds=False).ape.mean()),
                   "without_wait_pct": 100 * float(jitter_ratio_ape(rows, 0.0).mean())}
        print(f"held out by {by}: n-GPU / 1-GPU ratio MAPE {out[by]['scaling_ratio_mape_pct']:.1f} % "
              f"(one jitter for every job: {out[by]['one_jitter_pct']:.1f} %; no wait: "
              f"{out[by]['without_wait_pct']:.1f} %)")
    return out


def below_the_floor(held: dict[str, pd.DataFrame]) -> dict:
    """One-GPU runs measured faster than the floor every answer keeps (Σ of each kernel at the peak of its math or
    at the memory bandwidth, over the work the graph counts: `roofline_over_composed` of the composed step): no
    physically bounded answer or interval reaches them. Per hold-out: how many, the floor's own MAPE on them (the
    least any bounded answer can miss them by), the held-out answers' MAPE on them and on the rest, and the 80 %
    interval's coverage of the rest (printed and returned)."""
    out: dict = {}
    for by, frame in held.items():
        one = frame[frame.devices == 1]
        floor_ms = one.roofline_over_composed * one.placement_ms
        below = (one.measured_ms < floor_ms).to_numpy()
        ape = throughput_ape(one.predicted_ms, one.measured_ms)
        inside = ((one.measured_ms >= one.low_ms) & (one.measured_ms <= one.high_ms)).to_numpy()
        tf32 = (one.precision == "tf32").to_numpy()
        out[by] = {"configurations": int(below.sum()), "of": len(one),
                   "floor_mape_pct": 100 * float(throughput_ape(floor_ms[below], one.measured_ms[below]).mean()),
                   "answer_mape_pct": 100 * float(ape[below].mean()),
                   "rest_mape_pct": 100 * float(ape[~below].mean()),
                   "rest_coverage": float(inside[~below].mean()),
                   "tf32_rest_coverage": float(inside[~below & tf32].mean()),
                   "by_model": {figure_key(k): int(v) for k, v in one[below].groupby("model").size().items()}}
    if not out:
        return out
    first = next(iter(out.values()))
    print(f"\n## Faster than the floor (one GPU, measured step under Σ kernel rooflines: {first['configurations']} of "
          f"{first['of']} configurations, " + ", ".join(f"{k} {v}" for k, v in first["by_model"].items()) + ")\n\n"
          "No answer goes below the floor (every kernel at the peak of its math or at the memory bandwidth, for the "
          "work the graph counts), so no band covers these runs.")
    for by, f in out.items():
        print(f"held out by {by}: the floor itself {f['floor_mape_pct']:.1f} % off them, the answers "
              f"{f['answer_mape_pct']:.1f} %; the other one-GPU runs {f['rest_mape_pct']:.1f} %, 80 % band covers "
              f"{f['rest_coverage']:.2f} of them (TF32 {f['tf32_rest_coverage']:.2f})")
    return out


def fitted_in_sample(composed: pd.DataFrame, stage: str) -> dict:
    """How far the stage, fitted on every one-GPU run, still answers each GPU's own runs (each on the PyTorch it ran
    on): per GPU, the median and mean of log(answered / measured) (printed and returned, with the GPU it fits worst).
    Not a held-out figure: what the stage's spec-sheet device effect cannot express about a GPU it saw."""
    ones = composed[composed.devices == 1]
    ones = ones.assign(key=[run_key(r) for r in ones.itertuples(index=False)])
    fitted = fit_stage(composed, None, stage)
    answered = on_own_software(predict_from_frame(ones, fitted), ones, fitted)
    joined = ones.drop(columns=[c for c in answered.columns if c != "key" and c in ones]).merge(answered, on="key")
    log_ratio = np.log(joined.predicted_ms / joined.measured_ms)
    table = log_ratio.groupby(joined.accelerator).agg(["median", "mean", "size"]).sort_values("median")
    worst = str(table["median"].abs().idxmax())
    others = table.drop(index=worst)
    out = {"worst_gpu": figure_key(worst), "worst_median_log": float(table.loc[worst, "median"]),
           "worst_configurations": int(table.loc[worst, "size"]),
           "others_max_abs_median_log": float(others["median"].abs().max()),
           "others_median_abs_median_log": float(others["median"].abs().median()),
           "median_log_by_gpu": {figure_key(str(k)): float(v) for k, v in table["median"].items()}}
    print(f"\n## Fitted in sample (the {stage} stage fitted on every one-GPU run, answering them): "
          "log(answered / measured) per GPU, + = answered slow\n")
    print(table.round(3).to_string())
    print(f"fits worst: {worst} (median {out['worst_median_log']:+.3f} over {out['worst_configurations']} "
          f"configurations); every other GPU's median within {out['others_max_abs_median_log']:.3f}")
    return out


# SKUs of one die that differ in memory, not compute: the runs' only view of what bandwidth alone buys
SAME_DIE_PAIRS = (("a100-sxm4-40gb", "a100-sxm4-80gb"), ("a100-pcie-40gb", "a100-pcie-80gb"))


def same_die_gain(composed: pd.DataFrame, held_chip: pd.DataFrame) -> dict:
    """Print and return the median one-GPU throughput gain of the larger-memory SKU of each `SAME_DIE_PAIRS` pair
    (1.24-1.31x the bandwidth, the same peaks), over the (model, math, suite) configurations both ran: measured,
    composed, and as served with the chip held out (a stage that never saw the die, as for a new GPU)."""
    keys = ["model", "precision", "suite"]

    def gains(frame: pd.DataFrame, column: str) -> pd.Series:
        one = frame[frame.devices == 1]
        rate = (one.global_batch_size / one[column]).groupby([one.accelerator, *(one[k] for k in keys)]).median()
        return pd.concat([(rate[big] / rate[small]).dropna() for small, big in SAME_DIE_PAIRS
                          if small in rate.index.get_level_values(0) and big in rate.index.get_level_values(0)])

    measured = gains(composed, "measured_ms")
    out = {"configurations": len(measured), "measured": float(measured.median()),
           "composed": float(gains(composed, "placement_ms").median()),
           "chip_held_out": float(gains(held_chip, "predicted_ms").median())}
    print(f"\n## Bandwidth at equal compute (A100 40 GB -> 80 GB, SXM4 and PCIe, one GPU, {out['configurations']} "
          f"configurations)\n\nmedian gain: measured {out['measured']:.3f}x, composed {out['composed']:.3f}x, "
          f"served with the chip held out {out['chip_held_out']:.3f}x")
    return out


def held_ratio_ape(rows: pd.DataFrame, by: str, kinds: bool = True) -> pd.DataFrame:
    """`rows` (`jitter_rows`) with `ape`: each run's n-GPU / 1-GPU ratio APE, the replica jitters fitted without the
    run's `by` group (family or chip): by the kind of each model's steps (`fit_replica_jitters`), or one for every
    job (`kinds` False)."""
    def held(group: str) -> pd.DataFrame:
        test, train = rows[rows[by] == group], rows[rows[by] != group]
        jitter = row_jitters(test, fit_replica_jitters(train)) if kinds else fit_dp_jitter(train)
        return test.assign(ape=jitter_ratio_ape(test, jitter))

    return pd.concat([held(group) for group in sorted(rows[by].unique())], ignore_index=True)


def without_p2p(args: argparse.Namespace, composed: pd.DataFrame) -> dict:
    """Print and return the n-GPU / 1-GPU ratio's MAPE per suite with the catalog's links and with suite
    `args.no_p2p_suite` composed without peer-to-peer."""
    from perfmodel.predictor.placed import PlacementPredictor

    predictor = PlacementPredictor.load(args.models_dir,
                                        graphs=disk_graphs(args.graph_cache) if args.graph_cache else None)
    runs = lambda_runs(args.datasets / "lambda")
    recomposed = recomposed_without_p2p(composed, runs, predictor, args.no_p2p_suite)
    print(f"\n## If the {args.no_p2p_suite} runs had no peer-to-peer (NCCL_P2P_DISABLE=1; not recorded)\n\n"
          "n-GPU / 1-GPU ratio MAPE %, replica jitter held out by family\n\n| links | all | "
          + " | ".join(sorted(composed.suite.unique())) + " |\n|---|---:|" + "---:|" * composed.suite.nunique())
    out: dict = {"suite": args.no_p2p_suite}
    for label, frame in (("catalog", composed), ("host", recomposed)):
        ape = held_ratio_ape(jitter_rows(frame), "family")
        by_suite = ape.groupby("suite").ape.mean()
        out[label] = {"scaling_ratio_mape_pct": 100 * float(ape.ape.mean()),
                      **{f"{suite}_pct": 100 * float(v) for suite, v in by_suite.items()}}
        print(f"| {label if label == 'catalog' else args.no_p2p_suite + ': host'} | {100 * ape.ape.mean():.1f} | "
              + " | ".join(f"{100 * by_suite[s]:.1f}" for s in sorted(composed.suite.unique())) + " |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=Path, default=get_settings().datasets_dir)
    parser.add_argument("--cache", type=Path, help="keep the composed runs in this Parquet file (re-runs skip "
                        "composing; delete it after changing the kernel model or the zoo)")
    parser.add_argument("--graph-cache", type=Path, help="keep captured graphs (IR JSON) in this folder")
    parser.add_argument("--out", type=Path, help="write every held-out prediction to this CSV")
    parser.add_argument("--report", type=Path, help="also write the Markdown report and plots in this folder")
    parser.add_argument("--stage", choices=STAGES, default=DEFAULT_STAGE, help="the whole-step stage to fit")
    parser.add_argument("--write", action="store_true", help="fit the stage on every run and save its next version")
    parser.add_argument("--promote", action="store_true", help="with --write: promote it (role whole-step)")
    parser.add_argument("--models-dir", type=Path, help="registry root (default: the shipped models/)")
    parser.add_argument("--write-jitter", action="store_true",
                        help="store the replica jitter and the scaling band fitted on every run as the "
                        "placement model's default")
    parser.add_argument("--no-p2p-suite", metavar="SUITE",
                        help="also print the scaling ratio with this suite's runs composed without peer-to-peer")
    add_record_option(parser)
    args = parser.parse_args(argv)

    if not (args.datasets / "lambda").is_dir():
        print(f"no Lambda runs at {args.datasets / 'lambda'}: nothing to judge", file=sys.stderr)
        return 2
    started = time.perf_counter()
    result = gpu_accuracy(args.datasets, args.models_dir, args.cache, progress=lambda m: print("  " + m, flush=True),
                          graph_cache=args.graph_cache, stage=args.stage)
    print("\n".join(result.notes))
    show(result.composed, "Composed kernel sum + placement model, no whole-step stage (before)")
    titles = {"family": "Leave one model family out (all GPUs)",
              "chip": "Leave one chip out (every SKU of the die; the kernel model saw some chips' kernels)"}
    for by, held in result.held.items():
        show(held, titles[by])
        newest = newest_software(held)
        if len(newest):
            print(f"\nthe runs on PyTorch {newest.pytorch_version.iloc[0]} (the newest container; answered as "
                  f"served): {headline_line(newest)}")
        if args.out is not None:
            held.to_csv(args.out.with_name(f"{args.out.stem}-{by}{args.out.suffix}"), index=False)
    spread = show_repeat_spread(args.datasets)
    floor = below_the_floor(result.held)
    jitter = replica_jitter(result.composed)
    bandwidth = same_die_gain(result.composed, result.held["chip"]) if "chip" in result.held else None
    in_sample = fitted_in_sample(result.composed, args.stage) if args.stage == DEFAULT_STAGE else None
    p2p = {"without_p2p": without_p2p(args, result.composed)} if args.no_p2p_suite else {}
    record_if_asked(args, "real_runs", {"composed": figures(result.composed),
                                        **{by: figures(held) for by, held in result.held.items()},
                                        **{f"{by}_newest_software": figures(newest_software(held))
                                           for by, held in result.held.items()},
                                        "replica_jitter": jitter, "same_die_gain": bandwidth,
                                        "fitted_in_sample": in_sample,
                                        "below_the_floor": floor, "repeat_spread": spread, **p2p})
    if args.write_jitter:
        table = json.loads(params_path().read_text())["params"]
        default = IterationParams.from_dict(table["default"])
        table["default"] = replace(default, dp_jitter=jitter["fitted_on_all"], dp_jitter_steady=jitter["steady"],
                                   dp_jitter_varying=jitter["varying"],
                                   scaling_band_log=tuple(jitter["scaling_band_log"]),
                                   source=default.source.split(" + Lambda")[0] + " + Lambda replica jitters and band")
        params_path().write_text(dump_params(table))
        print(f"wrote the replica jitters ({jitter['fitted_on_all']:.4f}, steady {jitter['steady']:.4f}, varying "
              f"{jitter['varying']:.4f}) and the scaling band into {params_path()}")
    if args.report is not None:
        print(f"\nreport: {write_gpu_report(result, args.report)['report']}")
    if args.write:
        from perfmodel.registry.registry import ModelRegistry

        registry = ModelRegistry(args.models_dir)
        stage = fit_stage(result.composed, None, args.stage)
        directory = registry.next_version_dir(args.stage)
        stage.save(directory)
        print(f"saved {directory} ({stage.n_samples_} one-GPU configurations)")
        if args.promote:
            registry.promote(f"{args.stage}/{directory.name}")
            print(f"promoted {args.stage}/{directory.name} (role whole-step)")
    print(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Real training runs held out, one GPU: the whole-step stage as gradient-boosted trees (`xgb-whole-step`) against
the graph neural network over the job's graph (`gnn-whole-step`), on the same folds.

    .venv/bin/python bench/real_runs_gnn.py [--frame /tmp/pm/composed.parquet] [--graphs DIR] [--epochs N]

The composed frame (`perfmodel.evaluation.real_runs.composed_frame`: Lambda's public PyTorch runs, 8 NVIDIA
DeepLearningExamples models, 27 GPUs, TF32 / AMP) is read, not built; its one-GPU rows are the data. Each row's job
graph (`RealRun.spec`: the zoo model at the entry's reference sequence length, the reference optimizer) is captured
on the meta device once per (model, batch, precision) and kept in `--graphs` (gzipped IR JSON). Hold-outs: leave
one model family out, and leave one chip out (`chip`: every SKU of one die). In each fold both stages are fitted on
the other rows (target log(measured / single_ms), groups: model families) and predict the held-out rows:

- none: the composed one-GPU step (`single_ms`);
- xgb: `fit_stage` (`WholeStepRegressor` over `COMPOSITION_FEATURES`), single_ms x exp(log factor);
- gnn: `WholeStepGNN` over the job graph + the same features.

Printed: MAPE of the throughput the corrected step implies against the measured one (all, per math mode), median
APE, the worst GPU, the 80 % band's coverage, per held-out group, and the time to fit and predict. CPU only, one
thread. `--record [RUN]` records each stage's MAPE and median APE per hold-out for docs/accuracy.md
(bench/_figures.py).
Data: Lambda, lambdal/deeplearning-benchmark (through the composed frame).
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from _figures import add_record_option, record_if_asked

from perfmodel.core.accuracy import throughput_ape
from perfmodel.core.ir import Graph
from perfmodel.jobs.spec import Precision
from perfmodel.predictor.composition import COMPOSITION_FEATURES
from perfmodel.regressors.whole_step_gnn import CompressedGraph, WholeStepGNN

MODES = ("tf32", "amp")
STAGES = ("none", "xgb", "gnn")
HOLDOUTS = {"family": "Leave one model family out", "chip": "Leave one chip out (every SKU of the die)"}


class JobGraphs:
    """The graph of each real run's job, by (model, batch_size, precision), captured once on the meta device and
    kept in `folder` (gzipped IR JSON) so that a re-run captures nothing. Precisions that capture the same graph
    share one capture: only `fp16`/`bf16` cast the module (`Precision.half_weights`); TF32 and autocast change
    the math the kernels run, which the pricing (and the composition features) see, not the captured graph.
    Nothing is kept in memory (Tacotron 2's graph has 33k nodes): callers keep what they derive."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder
        self.capture_s: dict[tuple[str, int, str], float] = {}  # capture (or read) time of each graph

    @staticmethod
    def capture_key(model: str, batch_size: int, precision: str) -> tuple[str, int, str]:
        captured = precision if Precision(precision).half_weights else "fp32"
        return model, int(batch_size), captured

    def get(self, model: str, batch_size: int, precision: str) -> Graph:
        key = self.capture_key(model, batch_size, precision)
        path = self.folder / f"{key[0]}-b{key[1]}-{key[2]}.json.gz" if self.folder is not None else None
        start = time.perf_counter()
        if path is not None and path.is_file():
            graph = Graph.from_json(gzip.decompress(path.read_bytes()))
        else:
            graph = self._capture(*key)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_bytes(gzip.compress(graph.to_json().encode(), compresslevel=3))
                tmp.replace(path)
        self.capture_s[key] = time.perf_counter() - start
        return graph

    @staticmethod
    def _capture(model: str, batch_size: int, precision: str) -> Graph:
        from perfmodel.graph import graph_for_job
        from perfmodel.jobs.spec import JobSpec
        from perfmodel.jobs.zoo import ZOO

        # `RealRun.spec`: the zoo model at the entry's reference sequence length, the reference optimizer
        spec = JobSpec.from_options(zoo=model, batch_size=batch_size, seq_len=ZOO[model].reference_seq_len or 128,
                                    precision=precision)
        return graph_for_job(spec)


@dataclass
class Timings:
    """Seconds spent fitting and predicting, per stage, summed over the folds of one hold-out."""

    fit_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    predict_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    folds: int = 0


def job_graphs(rows: pd.DataFrame, cache: JobGraphs, model: WholeStepGNN) -> list[CompressedGraph]:
    """Each row's job graph, compressed once per job for `model` (rows of one job share the object)."""
    compressed: dict[tuple[str, int, str], CompressedGraph] = {}
    started = time.perf_counter()
    for row in rows.itertuples(index=False):
        key = cache.capture_key(row.model, row.batch_size, row.precision)
        if key not in compressed:
            compressed[key] = model.compress(cache.get(*key))
    graphs = [compressed[cache.capture_key(r.model, r.batch_size, r.precision)] for r in rows.itertuples(index=False)]
    print(f"{len(compressed)} job graphs, {sum(g.nodes for g in compressed.values())} IR nodes -> "
          f"{sum(len(g.count) for g in compressed.values())} after compression; captured or read in "
          f"{sum(cache.capture_s.values()):.0f} s, {time.perf_counter() - started:.0f} s with compression")
    return graphs


def one_gpu_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The one-GPU rows with a measured and a composed step, and their target log(measured / composed)."""
    from perfmodel.regressors.whole_step import TARGET

    ones = frame[(frame.devices == 1) & (frame.measured_ms > 0) & (frame.single_ms > 0)]
    return ones.assign(**{TARGET: np.log(ones.measured_ms / ones.single_ms)}).reset_index(drop=True)


def held_out(rows: pd.DataFrame, graphs: list[CompressedGraph], by: str, gnn_settings: dict,
             progress: Callable[[str], None] = lambda _: None) -> tuple[pd.DataFrame, Timings]:
    """Every row predicted by each stage fitted without its `by` group: `<stage>_ms` (the corrected one-GPU step)
    and, for the learned stages, `<stage>_low` / `<stage>_high` (the 80 % band)."""
    from perfmodel.evaluation.real_runs import fit_stage

    out = rows.assign(none_ms=rows.single_ms)
    for column in ("xgb_ms", "xgb_low", "xgb_high", "gnn_ms", "gnn_low", "gnn_high"):
        out[column] = np.nan
    timings = Timings()
    for group in sorted(rows[by].unique()):
        test = (rows[by] == group).to_numpy()
        train, train_graphs = rows[~test], [g for g, t in zip(graphs, test) if not t]
        if len(train) < 5:
            continue
        test_graphs = [g for g, t in zip(graphs, test) if t]
        progress(f"{by} {group}: {int(test.sum())} held out, {len(train)} to fit")
        started = time.perf_counter()
        xgb = fit_stage(train, COMPOSITION_FEATURES, "xgb-whole-step", nthread=1)
        fitted = time.perf_counter()
        corrections = {"xgb": xgb.predict(rows[test])}
        timings.fit_s["xgb"] += fitted - started
        timings.predict_s["xgb"] += time.perf_counter() - fitted
        started = time.perf_counter()
        gnn = WholeStepGNN(feature_names=COMPOSITION_FEATURES, **gnn_settings).fit(
            train, train_graphs, groups=list(train.family), keys=list(train.key))
        fitted = time.perf_counter()
        corrections["gnn"] = gnn.predict(rows[test], test_graphs)
        timings.fit_s["gnn"] += fitted - started
        timings.predict_s["gnn"] += time.perf_counter() - fitted
        timings.folds += 1
        single = rows.single_ms[test].to_numpy()
        for stage, correction in corrections.items():
            out.loc[test, f"{stage}_ms"] = single * np.exp(correction.log_factor)
            out.loc[test, f"{stage}_low"] = single * np.exp(correction.log_low)
            out.loc[test, f"{stage}_high"] = single * np.exp(correction.log_high)
    return out, timings


def _ape(out: pd.DataFrame, stage: str) -> pd.Series:
    """Each row's throughput APE (`perfmodel.core.accuracy.throughput_ape`)."""
    return pd.Series(throughput_ape(out[f"{stage}_ms"], out.measured_ms), index=out.index)


def stage_table(out: pd.DataFrame, timings: Timings) -> str:
    """Markdown: per stage, MAPE (all, per math mode), median APE, the worst GPU, the band's coverage, seconds."""
    lines = ["| stage | rows | MAPE | " + " | ".join(f"MAPE {m.upper()}" for m in MODES)
             + " | median APE | worst GPU | 80 % band covers | fit s | predict s |",
             "|---|---:|---:|" + "---:|" * len(MODES) + "---:|---|---:|---:|---:|"]
    for stage in STAGES:
        part = out[out[f"{stage}_ms"].notna()]
        err = _ape(part, stage)
        modes = " | ".join(f"{err[part.precision == m].mean():.1%}" if (part.precision == m).any() else "-"
                           for m in MODES)
        by_gpu = err.groupby(part.accelerator).mean()
        cover = "-"
        if f"{stage}_low" in part:
            inside = (part.measured_ms >= part[f"{stage}_low"]) & (part.measured_ms <= part[f"{stage}_high"])
            cover = f"{inside.mean():.2f}"
        lines.append(f"| {stage} | {len(part)} | {err.mean():.1%} | {modes} | {err.median():.1%} | "
                     f"{by_gpu.idxmax()} {by_gpu.max():.1%} | {cover} | {timings.fit_s[stage]:.1f} | "
                     f"{timings.predict_s[stage]:.2f} |")
    return "\n".join(lines)


def stage_figures(out: pd.DataFrame) -> dict:
    """What `stage_table` prints of each stage, for docs/figures."""
    figures = {}
    for stage in STAGES:
        part = out[out[f"{stage}_ms"].notna()]
        err = _ape(part, stage)
        figures[stage] = {"rows": len(part), "mape_pct": 100 * err.mean(), "median_ape_pct": 100 * err.median()}
    return figures


def group_table(out: pd.DataFrame, by: str) -> str:
    """Markdown: MAPE of each stage per held-out group."""
    lines = [f"| held-out {by} | rows | " + " | ".join(STAGES) + " |", "|---|---:|" + "---:|" * len(STAGES)]
    for group, part in out.groupby(by):
        lines.append(f"| {group} | {len(part)} | " + " | ".join(f"{_ape(part, s).mean():.1%}" for s in STAGES) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frame", type=Path, default=Path("/tmp/pm/composed.parquet"),
                        help="the composed frame (Parquet) of the real runs")
    parser.add_argument("--graphs", type=Path, help="keep captured job graphs here (default: next to the frame)")
    parser.add_argument("--holdouts", nargs="+", choices=tuple(HOLDOUTS), default=list(HOLDOUTS))
    parser.add_argument("--epochs", type=int, help="gnn-whole-step epochs (default: the estimator's)")
    parser.add_argument("--hidden", type=int, help="gnn-whole-step hidden width (default: the estimator's)")
    parser.add_argument("--layers", type=int, help="gnn-whole-step message-passing layers (default: the estimator's)")
    parser.add_argument("--out", type=Path, help="write every held-out prediction to this CSV (one per hold-out)")
    add_record_option(parser)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    if not args.frame.is_file():
        print(f"no composed frame at {args.frame}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    rows = one_gpu_rows(pd.read_parquet(args.frame))
    given = {"epochs": args.epochs, "hidden": args.hidden, "layers": args.layers}
    settings = {**{k: v for k, v in given.items() if v is not None}, "threads": 1}
    graphs = job_graphs(rows, JobGraphs(args.graphs or args.frame.parent / "gnn-graphs"),
                        WholeStepGNN(**settings))
    print(f"{len(rows)} one-GPU configurations, {rows.model.nunique()} models, {rows.accelerator.nunique()} GPUs, "
          f"{rows.chip.nunique()} chips")
    gnn = WholeStepGNN(**settings).get_params()
    print(f"gnn-whole-step: {', '.join(f'{k}={v}' for k, v in gnn.items() if k != 'feature_names')}; "
          f"xgb-whole-step: fit_stage defaults, nthread=1; both over the {len(COMPOSITION_FEATURES)} composition "
          f"features")
    recorded = {}
    for by in args.holdouts:
        out, timings = held_out(rows, graphs, by, settings, progress=lambda m: print("  " + m, flush=True))
        print(f"\n## {HOLDOUTS[by]} ({timings.folds} folds; one GPU)\n\n{stage_table(out, timings)}\n\n"
              f"{group_table(out, by)}\n", flush=True)
        if args.out is not None:
            out.drop(columns=[c for c in out.columns if c.startswith(("share_", "log_"))]).to_csv(
                args.out.with_name(f"{args.out.stem}-{by}{args.out.suffix}"), index=False)
        recorded[by] = stage_figures(out)
    record_if_asked(args, "real_runs_gnn", recorded)
    print(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

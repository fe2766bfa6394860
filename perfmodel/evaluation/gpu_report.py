"""The GPU accuracy report a user can read: real training runs predicted with their model family or their chip held
out, as Markdown tables and predicted-vs-measured plots per GPU and per math mode.

    result = gpu_accuracy(datasets_dir)          # composes every run, then both hold-outs (minutes)
    paths = write_gpu_report(result, "reports/gpu-accuracy")

`perfmodel report gpu-accuracy` and `bench/real_runs.py` call these; `perfmodel retrain` regenerates the report.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from perfmodel.core.accuracy import throughput_ape
from perfmodel.core.atomic import write_text_atomically
from perfmodel.core.errors import PerfmodelError
from perfmodel.evaluation.real_runs import RealRun, scaling_ratio_errors

MODES = {"tf32": "TF32 (FP32 in NGC)", "amp": "AMP (per-op casts)",
         "fp16-master": "FP16, fp32 master weights (apex O2)", "fp32": "FP32"}
MARKERS = {"tf32": "o", "amp": "^", "fp16-master": "v", "fp32": "s"}  # each math's marker in the plots (else "x")
HOLDOUTS = {"family": "Leave one model family out (all GPUs)",
            "chip": "Leave one chip out (every SKU of the die)"}
PLOT_COLUMNS = 4


@dataclass
class GpuAccuracy:
    """Composed (`composed`: no whole-step stage) and held-out (`held[by]`) predictions of every run."""

    composed: pd.DataFrame
    held: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))


def gpu_accuracy(datasets_dir: str | Path | None = None, models_dir: Any = None, cache: Path | None = None,
                 progress: Callable[[str], None] = lambda _: None, runs: Sequence[RealRun] | None = None,
                 graph_cache: Path | None = None, stage: str | None = None) -> GpuAccuracy:
    """Compose the runs (Lambda's, from `datasets_dir`, unless `runs` are given: e.g. a store's) through the serving
    path without the stage, then predict each with a stage fitted without its family, and without its chip.
    `cache`: a Parquet file keeping the composed frame; `graph_cache`: a folder keeping the captured graphs;
    `stage`: the whole-step stage to fit (`real_runs.STAGES`, default `DEFAULT_STAGE`)."""
    from perfmodel.evaluation.real_runs import (
        DEFAULT_STAGE,
        composed_frame,
        disk_graphs,
        lambda_runs,
        leave_one_out,
        read_composed,
        steady_steps,
        with_software,
    )
    from perfmodel.predictor.placed import PlacementPredictor

    if runs is None:
        if datasets_dir is None:
            raise PerfmodelError("give the datasets folder or the runs")
        runs = lambda_runs(Path(datasets_dir) / "lambda")
    predictor = PlacementPredictor.load(models_dir, graphs=disk_graphs(graph_cache) if graph_cache else None)
    predictor.set_whole_step(None)
    frame = read_composed(cache)
    if frame is None:
        frame = composed_frame(runs, predictor, progress=progress)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            frame.to_parquet(cache)
    notes = [f"{len(runs)} measured configurations ({sum(r.repeats for r in runs)} runs; repeats merged into their "
             f"median) of {len({r.model for r in runs})} models on {len({r.accelerator for r in runs})} GPUs, "
             f"1-{max(r.devices for r in runs)} GPUs per node"]
    frame = with_software(frame, runs)
    steady, left_out = steady_steps(frame)
    notes += left_out
    frame = frame[steady]
    result = GpuAccuracy(frame.assign(predicted_ms=frame.placement_ms), notes=notes)
    for by in HOLDOUTS:
        result.held[by] = leave_one_out(runs, frame, predictor, by, progress=progress, stage=stage or DEFAULT_STAGE)
    return result


def _ape(frame: pd.DataFrame) -> pd.Series:
    """Each run's throughput APE (what a scheduler reads), from its predicted and measured step."""
    return pd.Series(throughput_ape(frame.predicted_ms, frame.measured_ms), index=frame.index)


def headline(frame: pd.DataFrame) -> dict[str, float]:
    """One GPU and 2-16 GPU MAPE and median APE (of the throughput), worst GPU, scaling-ratio error and 80 %
    coverage of held-out predictions."""
    err = _ape(frame)
    one = frame.devices == 1
    by_gpu = err.groupby(frame.accelerator).mean()
    ratios = scaling_ratio_errors(frame, "predicted_ms")
    out = {"runs": float(len(frame)), "mape_1gpu": float(err[one].mean()) if one.any() else math.nan,
           "mape_multi": float(err[~one].mean()) if (~one).any() else math.nan,
           "median_1gpu": float(err[one].median()) if one.any() else math.nan,
           "median_multi": float(err[~one].median()) if (~one).any() else math.nan,
           "worst_gpu_mape": float(by_gpu.max()) if len(by_gpu) else math.nan,
           "scaling_ratio_mape": float(ratios.ape.mean()) if len(ratios) else math.nan}
    if {"low_ms", "high_ms"} <= set(frame.columns) and frame.low_ms.notna().all():
        out["coverage"] = float(((frame.measured_ms >= frame.low_ms) & (frame.measured_ms <= frame.high_ms)).mean())
    out["worst_gpu"] = by_gpu.idxmax() if len(by_gpu) else ""  # type: ignore[assignment]
    return out


def mode_table(frame: pd.DataFrame) -> str:
    """Markdown: MAPE per math mode and GPU count, with the worst GPU and the interval's coverage."""
    lines = ["| math | GPUs | configurations | MAPE | median APE | worst GPU | 80 % interval covers |",
             "|---|---|---:|---:|---:|---|---:|"]
    for precision in sorted(frame.precision.unique()):
        for label, mask in (("1", frame.devices == 1), ("2-16", frame.devices > 1)):
            part = frame[(frame.precision == precision) & mask]
            if part.empty:
                continue
            err = _ape(part)
            by_gpu = err.groupby(part.accelerator).mean()
            cover = ""
            if {"low_ms", "high_ms"} <= set(part.columns) and part.low_ms.notna().all():
                cover = f"{((part.measured_ms >= part.low_ms) & (part.measured_ms <= part.high_ms)).mean():.2f}"
            lines.append(f"| {MODES.get(precision, precision)} | {label} | {len(part)} | {err.mean():.1%} | "
                         f"{err.median():.1%} | {by_gpu.idxmax()} {by_gpu.max():.1%} | {cover} |")
    return "\n".join(lines)


def group_table(frame: pd.DataFrame, by: str) -> str:
    err = _ape(frame)
    groups = err.groupby(frame[by])
    lines = [f"| {by} | configurations | MAPE | median APE |", "|---|---:|---:|---:|"]
    for name, values in groups:
        lines.append(f"| {name} | {len(values)} | {values.mean():.1%} | {values.median():.1%} |")
    return "\n".join(lines)


def headline_line(frame: pd.DataFrame) -> str:
    h = headline(frame)
    line = (f"throughput: one GPU {h['mape_1gpu']:.1%} MAPE (median APE {h['median_1gpu']:.1%}), 2-16 GPUs "
            f"{h['mape_multi']:.1%} ({h['median_multi']:.1%}), worst GPU {h['worst_gpu']} "
            f"{h['worst_gpu_mape']:.1%}, n-GPU / 1-GPU scaling ratio {h['scaling_ratio_mape']:.1%}")
    if "coverage" in h:
        line += f", 80 % interval covers {h['coverage']:.2f}"
    return line


def _plot(frame: pd.DataFrame, by: str, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted(frame[by].unique())
    rows = max(1, math.ceil(len(groups) / PLOT_COLUMNS))
    fig, axes = plt.subplots(rows, PLOT_COLUMNS, figsize=(4 * PLOT_COLUMNS, 3.6 * rows), squeeze=False)
    for ax, group in zip(axes.flat, groups):
        part = frame[frame[by] == group]
        measured = part.global_batch_size / part.measured_ms * 1e3
        predicted = part.global_batch_size / part.predicted_ms * 1e3
        for precision in sorted(part.precision.unique(), key=lambda p: (p not in MARKERS, str(p))):
            sel = (part.precision == precision).to_numpy()
            ax.scatter(measured[sel], predicted[sel], marker=MARKERS.get(precision, "x"), s=14,
                       label=MODES.get(precision, precision))
        lo, hi = float(min(measured.min(), predicted.min())), float(max(measured.max(), predicted.max()))
        ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{group} ({_ape(part).mean():.0%})", fontsize=9)
        ax.set_xlabel("measured samples/s", fontsize=8)
        ax.set_ylabel("predicted samples/s", fontsize=8)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def write_gpu_report(result: GpuAccuracy, folder: str | Path) -> dict[str, Path]:
    """`gpu-accuracy.md` and its plots (`gpu-accuracy-<holdout>-by-<gpu|precision>.png`) in `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    parts = [
        "# GPU accuracy on real training runs",
        "",
        f"Generated {result.created_at:%Y-%m-%d %H:%M} UTC by `perfmodel report gpu-accuracy` (also "
        "`.venv/bin/python bench/real_runs.py`). Data: Lambda's public PyTorch training benchmarks "
        "(lambdal/deeplearning-benchmark, credit Lambda): NVIDIA DeepLearningExamples models in NGC containers, "
        "FP32 (TF32 on Ampere and later) and AMP, one node of 1-16 GPUs, each run at Lambda's per-GPU batch.",
        "",
        *(f"- {note}" for note in result.notes),
        "- Errors are of the throughput (samples/s) a predicted step implies, as a scheduler reads it: a step "
        "predicted twice too fast is 100 % off, twice too slow 50 %. The mean (MAPE) is pulled by the few runs "
        "farthest off; the median APE is beside it.",
        "- Every prediction below was made by a whole-step stage fitted without the run's model family (or chip), "
        "through the same code path as `POST /v1/predict`. The per-op kernel model underneath is the shipped one; "
        "it was fitted on kernel measurements that include some of these chips (A100, V100, A40, RTX 3090, RTX "
        "A6000, RTX 4090, T4), so the chip hold-out holds out their end-to-end runs, not their kernels.",
        "",
        "## Before the whole-step stage (composed kernel sum + placement model)",
        "",
        headline_line(result.composed),
        "",
        mode_table(result.composed),
    ]
    for by, data in result.held.items():
        if data.empty:
            continue
        parts += ["", f"## {HOLDOUTS.get(by, by)}", "", headline_line(data), "", mode_table(data), "",
                  group_table(data, "family"), "", group_table(data, "accelerator")]
        for axis in ("accelerator", "precision"):
            name = f"gpu-accuracy-{by}-by-{'gpu' if axis == 'accelerator' else axis}.png"
            paths[name] = _plot(data, axis, folder / name, f"{HOLDOUTS.get(by, by)}: predicted vs measured")
            parts += ["", f"![{name}]({name})"]
    report = folder / "gpu-accuracy.md"
    write_text_atomically(report, "\n".join(parts) + "\n")
    paths["report"] = report
    return paths


__all__ = ["GpuAccuracy", "gpu_accuracy", "headline", "headline_line", "mode_table", "write_gpu_report"]

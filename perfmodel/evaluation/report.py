"""An `EvaluationResult` as files: `report.md` (tables and method), `predictions.csv` (every held-out prediction)
and two PNG plots (a matplotlib `Figure` on the Agg canvas; pyplot is never imported): predicted vs measured, and
MAPE by family."""

from __future__ import annotations

import csv
from dataclasses import asdict, fields
from pathlib import Path

from perfmodel.evaluation.crossval import ErrorMetrics, EvaluationResult, HeldOutPrediction

REPORT_FILE = "report.md"
PREDICTIONS_FILE = "predictions.csv"
SCATTER_FILE = "predicted_vs_measured.png"
FAMILY_FILE = "error_by_family.png"


def write_report(result: EvaluationResult, directory: str | Path) -> dict[str, Path]:
    """Write the report files into `directory` (created if needed); returns their paths by kind."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {
        "report": directory / REPORT_FILE,
        "predictions": directory / PREDICTIONS_FILE,
        "scatter": directory / SCATTER_FILE,
        "families": directory / FAMILY_FILE,
    }
    write_predictions_csv(result.predictions, paths["predictions"])
    plot_predicted_vs_measured(result, paths["scatter"])
    plot_error_by_family(result, paths["families"])
    paths["report"].write_text(render_markdown(result), encoding="utf-8")
    return paths


def write_predictions_csv(predictions: tuple[HeldOutPrediction, ...], path: Path) -> None:
    names = [f.name for f in fields(HeldOutPrediction)] + ["ape_pct"]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=names)
        writer.writeheader()
        for p in predictions:
            writer.writerow({**asdict(p), "ape_pct": round(p.ape_pct, 4)})


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} %"


def render_markdown(result: EvaluationResult) -> str:
    """The report's Markdown (pure)."""
    n_samples = result.overall_for(result.regressors[0]).samples if result.regressors else 0
    families = result.families
    noise = result.noise_median_cv_pct
    lines = [
        "# Regressor evaluation: family-grouped cross-validation",
        "",
        f"{n_samples} measured samples of {len(families)} model families, {result.folds} folds (seed "
        f"{result.seed}). Every sample is predicted once by a model that never saw its family.",
        "",
        "## Overall",
        "",
        "| regressor | samples | MAPE | median APE | p90 APE | interval coverage | median pred/meas | worst family "
        "(MAPE) | fit time |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name in result.regressors:
        m = result.overall_for(name)
        worst = result.worst_family(name)
        worst_text = f"{worst.family} ({_pct(worst.mape_pct)})" if worst else "–"
        lines.append(f"| {name} | {m.samples} | {_pct(m.mape_pct)} | {_pct(m.median_ape_pct)} | "
                     f"{_pct(m.p90_ape_pct)} | {m.interval_coverage:.2f} | {m.median_ratio:.3g} | {worst_text} | "
                     f"{result.fit_s.get(name, 0.0):.1f} s |")
    lines += [
        "",
        "## Measurement noise",
        "",
        f"Median coefficient of variation of the held-out measurements (std / mean of each job's timed steps): "
        f"**{_pct(noise)}**. Errors of that size are within run-to-run noise.",
        "",
        "## Per family (MAPE)",
        "",
        "| family | samples | median CV | " + " | ".join(result.regressors) + " |",
        "|---|---:|---:|" + "---:|" * len(result.regressors),
    ]
    by_regressor = {name: result.family_metrics(name) for name in result.regressors}
    for family in families:
        first: ErrorMetrics = next(by_regressor[name][family] for name in result.regressors
                                   if family in by_regressor[name])
        cells = [_pct(by_regressor[name][family].mape_pct) if family in by_regressor[name] else "–"
                 for name in result.regressors]
        lines.append(f"| {family} | {first.samples} | {_pct(first.median_cv_pct)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Plots",
        "",
        f"![predicted vs measured]({SCATTER_FILE})",
        "",
        f"![MAPE by family]({FAMILY_FILE})",
        "",
        "## How it was computed",
        "",
        "- Samples are grouped by model family and split into folds, largest family first into the fold with the "
        "fewest samples, so a family is never in training and test at once (`perfmodel.features.dataset."
        "family_folds`).",
        "- For each fold, a fresh regressor is fitted on the other folds and predicts the held-out fold; every sample "
        "is held out exactly once. The measured time is the median of the profile's timed steps.",
        "- APE = |predicted − measured| / measured. MAPE is its mean, p90 APE its 90th percentile. Interval coverage "
        "is the fraction of measured times inside the predicted [p10, p90] (0.80 when calibrated; a point "
        "estimate such as the roofline covers ~0). Median pred/meas < 1 means the regressor predicts too fast.",
        f"- Every held-out prediction is in `{PREDICTIONS_FILE}`.",
        "",
    ]
    return "\n".join(lines)


def plot_predicted_vs_measured(result: EvaluationResult, path: Path) -> None:
    """Log-log scatter of predicted vs measured iteration time, one colour per regressor, with the y = x line."""
    fig = _figure(6.5, 6)
    ax = fig.subplots()
    values = [v for p in result.predictions for v in (p.measured_ms, p.predicted_ms) if v > 0]
    for name in result.regressors:
        rows = [p for p in result.predictions if p.regressor == name and p.predicted_ms > 0]
        ax.scatter([p.measured_ms for p in rows], [p.predicted_ms for p in rows], s=14, alpha=0.7, label=name)
    if values:
        low, high = min(values) / 1.5, max(values) * 1.5
        ax.plot([low, high], [low, high], color="black", linewidth=0.8, linestyle="--", label="y = x")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured iteration time (ms)")
    ax.set_ylabel("predicted iteration time (ms)")
    ax.set_title("Held-out predictions (family k-fold)")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_error_by_family(result: EvaluationResult, path: Path) -> None:
    """Horizontal grouped bars: MAPE per family, one bar per regressor."""
    import numpy as np

    families = result.families
    names = result.regressors
    height = 0.8 / max(1, len(names))
    fig = _figure(8, max(3.0, 0.3 * len(families) * max(1, len(names)) ** 0.5 + 1.5))
    ax = fig.subplots()
    positions = np.arange(len(families))
    for i, name in enumerate(names):
        by_family = result.family_metrics(name)
        mape = [by_family[f].mape_pct if f in by_family else 0.0 for f in families]
        ax.barh(positions + i * height, mape, height=height, label=name)
    ax.set_yticks(positions + height * (len(names) - 1) / 2)
    ax.set_yticklabels(families, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("MAPE (%)")
    ax.set_title("Held-out error by model family")
    noise = result.noise_median_cv_pct
    if noise is not None:
        ax.axvline(noise, color="grey", linestyle=":", linewidth=1, label=f"median CV {noise:.1f} %")
    ax.legend(fontsize=8, loc="best")
    ax.grid(True, axis="x", alpha=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _figure(width_in: float, height_in: float):
    """A standalone matplotlib figure on the Agg canvas: no pyplot, no global backend state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in))
    FigureCanvasAgg(fig)
    return fig

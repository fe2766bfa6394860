"""`perfmodel report gpu-accuracy`: real training runs predicted with their model family or chip held out, as a
Markdown report with predicted-vs-measured plots per GPU and per math mode."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from perfmodel.cli.common import out, user_errors

report_app = typer.Typer(no_args_is_help=True, help="Accuracy reports.")
Opt = typer.Option


@report_app.command("gpu-accuracy")
@user_errors
def gpu_accuracy_command(
        output: Annotated[Path, Opt("--out", help="report folder, relative to the current folder: from the checkout, "
                                                  "the default overwrites the committed report")] =
            Path("reports/gpu-accuracy"),
        datasets: Annotated[Optional[Path], Opt(
            help="public datasets folder (holds lambda/) \\[env PERFMODEL_DATASETS_DIR, default shared/datasets "
                 "beside the checkout]")] = None,
        cache: Annotated[Optional[Path], Opt(
            help="keep the composed runs in this Parquet file; a later run given the same file skips composing "
                 "them")] = None,
        graph_cache: Annotated[Optional[Path], Opt(
            help="keep the captured graphs (IR JSON) in this folder; a later run given it captures none")] = None,
        ) -> None:
    """Predict Lambda's public training runs (1,986 runs: TF32/AMP, 1-16 GPUs) with each model family and each chip
    held out of the whole-step stage; write gpu-accuracy.md and its plots to --out and print the report. Nothing
    runs on a GPU: the runs are read from --datasets and predicted on the CPU. Slow: composing every run takes about
    16 minutes on a 2-core machine, about 8 when --cache holds the runs and --graph-cache the graphs an earlier run
    composed and captured (the held-out predictions run the serving path, which needs the graphs: without them, 25)."""
    from perfmodel.core.errors import PerfmodelError
    from perfmodel.evaluation.gpu_report import gpu_accuracy, write_gpu_report
    from perfmodel.settings import get_settings

    root = datasets if datasets is not None else get_settings().datasets_dir
    if not (Path(root) / "lambda").is_dir():
        raise PerfmodelError(f"no Lambda runs at {Path(root) / 'lambda'} (give --datasets)")
    result = gpu_accuracy(root, cache=cache, graph_cache=graph_cache,
                          progress=lambda message: out.print(f"[dim]{message}[/]"))
    paths = write_gpu_report(result, output)
    sys.stdout.write(paths["report"].read_text())
    out.print(f"[dim]report and plots in {output}/[/]")

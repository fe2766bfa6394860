"""Real training runs held out: the learned whole-step stage judged on Lambda's public PyTorch runs (TF32 / AMP,
27 GPUs, 1-16 GPUs in a node), leave one model family out and leave one chip out.

    .venv/bin/python bench/real_runs.py [--datasets DIR] [--cache FILE.parquet] [--stage NAME] [--write] [--promote]

Steps: every successful run of a zoo model on a catalog GPU (repeats merged) is composed once through the serving
path without the stage (kernel sum per device + placement model), then for each hold-out group a stage is fitted
on the other groups' one-GPU runs and the group's runs are predicted through the serving path with it
(`PlacementPredictor.predict`: the stage corrects one device's compute, the placement model adds communication).
Prints MAPE per math mode and GPU count (one GPU; 2-16), the worst GPU, the 80 % interval's coverage and the
n-GPU / 1-GPU scaling ratio's error, for the composed prediction ("before") and each hold-out. `--stage`: the
stage to fit, `device-whole-step` (default: a spec-sheet device effect and a level per measured model) or
`xgb-whole-step` (boosted trees over the composition features). `--write` fits the stage on every run and saves it
as its next version in the registry; `--promote` promotes it (role whole-step). `--record [RUN]` records the
headline figures for docs/accuracy.md (bench/_figures.py).
Data: Lambda, lambdal/deeplearning-benchmark (read in place, never copied).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
from _figures import add_record_option, figure_key, record_if_asked

from perfmodel.evaluation.gpu_report import (
    gpu_accuracy,
    group_table,
    headline,
    headline_line,
    mode_table,
    write_gpu_report,
)
from perfmodel.evaluation.real_runs import DEFAULT_STAGE, STAGES, fit_stage
from perfmodel.settings import get_settings


def show(frame: pd.DataFrame, title: str) -> None:
    print(f"\n## {title}\n\n{headline_line(frame)}\n\n{mode_table(frame)}\n\n{group_table(frame, 'family')}\n\n"
          f"{group_table(frame, 'chip')}")


def figures(frame: pd.DataFrame) -> dict:
    """What `show` prints of one frame, for docs/figures: the headline and the per-family MAPE."""
    h = headline(frame)
    out = {"one_gpu_mape_pct": 100 * h["mape_1gpu"], "multi_gpu_mape_pct": 100 * h["mape_multi"],
           "worst_gpu": h["worst_gpu"], "worst_gpu_mape_pct": 100 * h["worst_gpu_mape"],
           "scaling_ratio_mape_pct": 100 * h["scaling_ratio_mape"]}
    if "coverage" in h:
        out["coverage"] = h["coverage"]
    ape = (frame.predicted_ms / frame.measured_ms - 1.0).abs()
    by_family = ape.groupby(frame.family)
    out["family_mape_pct"] = {figure_key(k): 100 * v for k, v in by_family.mean().items()}
    out["family_configurations"] = {figure_key(k): int(v) for k, v in by_family.size().items()}
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
        if args.out is not None:
            held.to_csv(args.out.with_name(f"{args.out.stem}-{by}{args.out.suffix}"), index=False)
    record_if_asked(args, "real_runs", {"composed": figures(result.composed),
                                        **{by: figures(held) for by, held in result.held.items()}})
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

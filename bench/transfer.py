"""Measured-profile transfer across GPUs, against NeuSight's per-op label tables.

Run: .venv/bin/python bench/transfer.py [--datasets ../shared/datasets] [--model NAME/VERSION]
                                         [--max-rows-per-class 20000] [--n-estimators N] [--nthread 1]
                                         [--models gpt2_large,...]

For every NeuSight per-op label table (`neusight/label/<GPU>/<model>-<inf|train>-<seq>-<batch>.csv`, torch.fx
nodes of a one-layer model, timed per node) that exists on two or more GPUs, each GPU's forward per-op times are
transferred to every other GPU: transferred = measured on the source × predicted(target) / predicted(source), per
node (`perfmodel.predictor.transfer.transfer_ops`), and summed over the nodes that map to a regressor row. The
comparison is the target's own measured sum over the same nodes; the baseline is the regressor's direct prediction
on the target (no measurement used).

The regressor: without `--model`, an `xgb-device-ops` regressor is trained per target GPU on NeuSight's op sweeps
of every *other* GPU (`data/dataset*/train/collect/`; the target's sweeps are left out, so the target is a GPU the
regressor never saw), on the op classes the label tables use (conv is not trained: no table has one), at most
`--max-rows-per-class` rows per class. With `--model`, that registered model is used for every target (it may have
seen the target GPU).

Prints how much of the measured time maps to regressor rows, what does not, one line per (table, source → target)
pair, and MAPE overall, per target, per source, per op class and per vendor crossing. `--record [RUN]` records the
MAPE tables for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
from _figures import add_record_option, figure_key, record_if_asked

from perfmodel.evaluation.transfer import (
    evaluate_transfer,
    mape_table,
    neusight_sweep_ops,
    read_label_table,
    scan_label_tables,
)
from perfmodel.hardware.catalog import load_catalog
from perfmodel.settings import get_settings

DEFAULT_DATASETS = get_settings().datasets_dir


def mape_figures(table: pd.DataFrame) -> dict:
    """A `mape_table`, one group per row, for docs/figures."""
    return {figure_key(key): {"pairs": int(r.pairs), "mape_transfer_pct": r.mape_transfer,
                              "median_ape_transfer_pct": r.median_ape_transfer, "mape_direct_pct": r.mape_direct,
                              "median_ape_direct_pct": r.median_ape_direct} for key, r in table.iterrows()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS,
                        help="folder holding neusight/ (default: ../shared/datasets)")
    parser.add_argument("--model", default=None, help="a registered xgb-device-ops model (NAME/VERSION or NAME) "
                                                      "instead of training one per target GPU")
    parser.add_argument("--max-rows-per-class", type=int, default=20000, help="training rows per op class")
    parser.add_argument("--n-estimators", type=int, default=None, help="boosting rounds [the regressor's default]")
    parser.add_argument("--models", default="", help="comma-separated model names to keep (default: all)")
    parser.add_argument("--nthread", type=int, default=1,
                        help="XGBoost threads [1: on a shared 2-core machine, 2 threads spin against other jobs]")
    parser.add_argument("--seed", type=int, default=0)
    add_record_option(parser)
    args = parser.parse_args(argv)
    started = time.perf_counter()

    catalog = load_catalog()
    tables, skipped = scan_label_tables(args.datasets, catalog)
    if args.models:
        keep = set(args.models.split(","))
        tables = [t for t in tables if t.model in keep]
    gpus_per_key: dict[tuple, set[str]] = {}
    for t in tables:
        gpus_per_key.setdefault(t.key, set()).add(t.device)
    tables = [t for t in tables if len(gpus_per_key[t.key]) >= 2]
    targets = sorted({t.device for t in tables})
    print(f"{len(tables)} per-op label tables of {len(gpus_per_key)} (model, mode, seq, batch) on 2+ GPUs; "
          f"GPUs: {', '.join(targets)}" + (f"; {len(skipped)} files skipped" if skipped else ""))

    classes = sorted({c for t in tables for c in read_label_table(t)["op_class"].dropna().unique()})
    regressors: dict[str, object] = {}
    train_s: dict[str, float] = {}
    if args.model:
        from perfmodel.registry.registry import ModelRegistry
        from perfmodel.regressors import load_regressor

        entry = ModelRegistry().get(args.model, role="device-ops")
        shared = load_regressor(entry.path)
        print(f"regressor: {entry.ref} for every target (it may have been trained on the target GPU)")

        def regressor_for_target(device: str):
            return shared
    else:
        from perfmodel.regressors.device_ops import DeviceOpRegressor

        settings = {"max_rows_per_class": args.max_rows_per_class, "seed": args.seed, "nthread": args.nthread}
        if args.n_estimators is not None:
            settings["n_estimators"] = args.n_estimators
        print(f"regressor: xgb-device-ops {settings}, trained per target GPU without it, on NeuSight's op sweeps "
              f"of {', '.join(classes)}")

        def regressor_for_target(device: str):
            if device not in regressors:
                start = time.perf_counter()
                ops = neusight_sweep_ops(args.datasets, catalog, exclude_devices=[device], op_classes=classes,
                                         seed=args.seed)
                regressors[device] = DeviceOpRegressor(**settings).fit(ops, catalog)
                train_s[device] = time.perf_counter() - start
                print(f"   trained without {device}: {len(ops)} sweep rows of {ops['device'].nunique()} GPUs "
                      f"({', '.join(sorted(ops['device'].unique()))}) in {train_s[device]:.1f} s", flush=True)
            return regressors[device]

    result = evaluate_transfer(tables, regressor_for_target, catalog)
    pairs = result.pairs

    pd.set_option("display.width", 220)
    pd.set_option("display.max_rows", 1000)
    fmt = {"float_format": lambda x: f"{x:.1f}"}

    cov = result.coverage
    print(f"\n== coverage: measured forward time of the nodes that map to regressor rows, per GPU (over "
          f"{cov.groupby(['model', 'mode', 'seq_len', 'batch_size']).ngroups} tables)")
    per_gpu = cov.groupby("gpu")[["total_ms", "mapped_ms", "no-kernel_ms", "unmapped_ms"]].sum()
    per_gpu["mapped_%"] = per_gpu["mapped_ms"] / per_gpu["total_ms"] * 100
    print(per_gpu.to_string(**fmt))
    total = cov["total_ms"].sum()
    print(f"   all: {cov['mapped_ms'].sum() / total * 100:.2f} % mapped, "
          f"{cov['no-kernel_ms'].sum() / total * 100:.2f} % no kernel, "
          f"{cov['unmapped_ms'].sum() / total * 100:.3f} % unmapped; per table "
          f"{cov['mapped_share'].min() * 100:.1f}-{cov['mapped_share'].max() * 100:.1f} % mapped")
    print("\n== nodes without a row (measured forward ms summed over all tables and GPUs)")
    print(result.unmapped.head(20).to_string(index=False, float_format=lambda x: f"{x:.2f}"))

    table = pairs[["model", "mode", "seq_len", "batch_size", "source", "target", "rows", "source_ms", "measured_ms",
                   "transferred_ms", "ape_transfer", "direct_ms", "ape_direct"]]
    table = table.rename(columns={"seq_len": "seq", "batch_size": "batch", "source_ms": "src_meas",
                                  "measured_ms": "tgt_meas", "transferred_ms": "transfer", "ape_transfer": "ape_tr",
                                  "direct_ms": "direct", "ape_direct": "ape_dir"})
    table = table.assign(source=table["source"].str.replace("NVIDIA_", "").str.replace("Tesla_", "")
                         .str.replace("AMD_Instinct_", ""),
                         target=table["target"].str.replace("NVIDIA_", "").str.replace("Tesla_", "")
                         .str.replace("AMD_Instinct_", ""))
    print("\n== per (table, source -> target): forward ms over the mapped nodes; APE in %")
    print(table.to_string(index=False, **fmt))

    print("\n== MAPE (%) overall: transfer (source measurement × regressor ratio) vs direct (regressor alone)")
    print(mape_table(pairs, None).to_string(**fmt))
    print(f"   whole tables (nodes without a row carried at the source's time): transfer MAPE "
          f"{pairs['ape_transfer_all'].mean():.1f} %, median {pairs['ape_transfer_all'].median():.1f} %")
    print("\n== MAPE (%) per target GPU")
    print(mape_table(pairs, "target_device").to_string(**fmt))
    print("\n== MAPE (%) per source GPU")
    print(mape_table(pairs, "source_device").to_string(**fmt))
    vendor = {d: catalog[d].vendor for d in targets}
    crossing = pairs["source_device"].map(vendor) + " -> " + pairs["target_device"].map(vendor)
    print("\n== MAPE (%) per vendor crossing")
    print(mape_table(pairs.assign(crossing=crossing), "crossing").to_string(**fmt))
    print("\n== MAPE (%) per op class (sum of the class's nodes per table and pair)")
    print(mape_table(result.classes, "op_class").to_string(**fmt))
    print("\n== MAPE (%) per model and mode")
    print(mape_table(pairs.assign(model_mode=pairs["model"] + " " + pairs["mode"]), "model_mode").to_string(**fmt))
    record_if_asked(args, "transfer", {
        "overall": mape_figures(mape_table(pairs, None))["all"],
        "whole_tables": {"mape_transfer_pct": pairs["ape_transfer_all"].mean(),
                         "median_ape_transfer_pct": pairs["ape_transfer_all"].median()},
        "target": mape_figures(mape_table(pairs, "target_device")),
        "source": mape_figures(mape_table(pairs, "source_device")),
        "crossing": mape_figures(mape_table(pairs.assign(crossing=crossing.str.replace(" -> ", "_to_")), "crossing")),
        "op_class": mape_figures(mape_table(result.classes, "op_class"))})
    if train_s:
        print(f"\ntraining: {sum(train_s.values()):.1f} s for {len(train_s)} regressors")
    print(f"total: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Whole-model time on NeuSight's GPUs from per-op predictions, against NeuSight's measured model latencies.

Run: .venv/bin/python bench/neusight_models.py [--datasets ../shared/datasets] [--models bert_large,gpt2_large]

Every single-GPU label (`neusight/label/<GPU>/<model>-<train|inf>-<seq>-<batch>.json`) is predicted: the model's
graph is captured on the meta device (once per model, batch, seq and mode; eager attention), mapped to op rows
(`perfmodel.predictor.device_ops.graph_op_rows`) and every row's latency predicted on the label's GPU. The
predictor is `--predictor xgb` (default): the per-op device regressor (xgb-device-ops) fitted, for each label's
GPU, on the fp32 op measurements of the *other* GPUs in `--store` (leave-one-GPU-out; run `perfmodel import
neusight ...` into that store first), or `--predictor roofline`: max(FLOPs / peak, bytes / bandwidth) per op.

    .venv/bin/python bench/neusight_models.py --store sqlite:////tmp/gpu-ops.db

Prints the graph capture times, a table per (model, mode, GPU) with measured and predicted forward / backward /
total ms and APE, and MAPE per device and overall. `--record [RUN]` records the MAPE per device, per model and mode
and overall for docs/accuracy.md (bench/_figures.py; `--record roofline` for `--predictor roofline`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
from _figures import add_record_option, figure_key, record_if_asked

from perfmodel.evaluation.device_ops import training_rows
from perfmodel.evaluation.neusight_models import GraphCache, evaluate_models, mape_by, scan_labels
from perfmodel.hardware.catalog import load_catalog
from perfmodel.lowering.ops import op_roofline_ms as roofline_ms
from perfmodel.regressors.device_ops import DeviceOpRegressor
from perfmodel.settings import get_settings
from perfmodel.store import ProfileStore

DEFAULT_DATASETS = get_settings().datasets_dir


def mape_figures(table: pd.DataFrame) -> dict:
    """One `mape_by` row, for docs/figures."""
    return {"labels": int(table["labels"]), **{f"{c}_pct": table[c] for c in ("mape_fw", "mape_bw", "mape_total")}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS,
                        help="folder holding neusight/ (default: ../shared/datasets)")
    parser.add_argument("--models", default="", help="comma-separated model names to keep (default: all)")
    parser.add_argument("--predictor", choices=("xgb", "roofline"), default="xgb")
    parser.add_argument("--store", help="store URL with imported op measurements (for --predictor xgb)")
    parser.add_argument("--max-rows-per-class", type=int, default=30000)
    parser.add_argument("--nthread", type=int, default=1, help="XGBoost threads (default 1)")
    add_record_option(parser)
    args = parser.parse_args(argv)

    catalog = load_catalog()
    labels, skipped = scan_labels(args.datasets, catalog)
    if args.models:
        keep = set(args.models.split(","))
        labels = [label for label in labels if label.model in keep]
    print(f"{len(labels)} single-GPU labels; {len(skipped)} files skipped "
          f"({', '.join(sorted({reason.split(' (')[0] for _, reason in skipped}))})")

    if args.predictor == "xgb" and not args.store:
        parser.error("--predictor xgb needs --store (a store holding `perfmodel import neusight` rows)")
    training = None
    if args.predictor == "xgb":
        with ProfileStore(args.store) as store:
            training = training_rows(store.op_measurements(source="neusight", dtype="fp32", extra=False))
    fitted: dict[str, DeviceOpRegressor] = {}

    def predict_fn_for_device(device: str):
        if args.predictor == "roofline":
            return lambda ops: roofline_ms(ops, catalog)
        if device not in fitted:  # leave this GPU out of training
            started = time.perf_counter()
            fitted[device] = DeviceOpRegressor(max_rows_per_class=args.max_rows_per_class, nthread=args.nthread).fit(
                training[training["device"] != device], catalog)
            print(f"   fitted without {device} in {time.perf_counter() - started:.0f} s")
        return lambda ops: fitted[device].predict(ops, catalog).latency_ms

    graphs = GraphCache.for_root(args.datasets)
    start = time.perf_counter()
    results = evaluate_models(predict_fn_for_device, labels, graphs=graphs, catalog=catalog)
    total_s = time.perf_counter() - start

    print(f"\n== graph capture (meta device, eager attention): {sum(graphs.capture_s.values()):.1f} s of "
          f"{total_s:.1f} s for the whole evaluation")
    for (model, batch, seq, mode), seconds in sorted(graphs.capture_s.items()):
        graph = graphs.graphs.get((model, batch, seq, mode))
        what = f"{len(graph.nodes)} nodes" if graph is not None else "FAILED"
        print(f"   {model:<11} {mode:<9} seq {seq:<5} batch {batch:<3} {seconds:6.2f} s  {what}")
    for message in sorted(set(graphs.failures.values())):
        jobs = [f"{mode} seq {seq} batch {batch}" for (_, batch, seq, mode), m in sorted(graphs.failures.items())
                if m == message]
        print(f"   not captured ({'; '.join(jobs)}): {message}")

    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 500)
    ok = results[results["error"].isna()]
    table = ok[["model", "mode", "seq_len", "batch_size", "gpu", "measured_fw_ms", "predicted_fw_ms", "ape_fw",
                "measured_bw_ms", "predicted_bw_ms", "ape_bw", "measured_total_ms", "predicted_total_ms",
                "ape_total"]].sort_values(["model", "mode", "seq_len", "batch_size", "gpu"])
    table = table.rename(columns=lambda c: c.replace("measured_", "meas_").replace("predicted_", "pred_")
                         .replace("_ms", "").replace("batch_size", "batch").replace("seq_len", "seq"))
    print("\n== per label (ms; APE in %)")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    errors = results[results["error"].notna()]
    if len(errors):
        print(f"\n== {len(errors)} labels not predicted")
        for (model, message), group in errors.groupby(["model", "error"]):
            print(f"   {model} ({len(group)} labels): {message}")
    print("\n== MAPE (%) per device")
    print(mape_by(results, "device").to_string(float_format=lambda x: f"{x:.1f}"))
    print("\n== MAPE (%) per model and mode")
    print(mape_by(results.assign(model_mode=results["model"] + " " + results["mode"]), "model_mode")
          .to_string(float_format=lambda x: f"{x:.1f}"))
    print("\n== MAPE (%) overall")
    print(mape_by(results, None).to_string(float_format=lambda x: f"{x:.1f}"))
    model_mode: dict = {}
    for (model, mode), part in results[results["error"].isna()].groupby(["model", "mode"]):
        model_mode.setdefault(figure_key(model), {})[figure_key(mode)] = mape_figures(mape_by(part, None).iloc[0])
    record_if_asked(args, "neusight_models", {
        "overall": mape_figures(mape_by(results, None).iloc[0]),
        "device": {figure_key(device): mape_figures(row) for device, row in mape_by(results, "device").iterrows()},
        "model_mode": model_mode})
    return 0


if __name__ == "__main__":
    sys.exit(main())

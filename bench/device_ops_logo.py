"""Leave-one-GPU-out validation of the per-op device regressor (xgb-device-ops) on public GPU measurements.

    perfmodel import neusight ../shared/datasets/neusight --store sqlite:////tmp/gpu-ops.db
    .venv/bin/python bench/device_ops_logo.py --store sqlite:////tmp/gpu-ops.db

Prints MAPE per op class × held-out GPU (fp32 NeuSight sweeps: bmm, linear, conv2d, elementwise, softmax,
layernorm), and per op class averaged over GPUs. A GPU is held out with its chip (`chip_of`: every A100 variant,
every source). Data: NeuSight (sitar-lab/NeuSight, MIT). Tensor-core rows: `--dtype fp16 --holdout-source vidur`
(A100, A40), `--dtype fp16|bf16 --holdout-source llmservingsim` (RTX 3090, A6000 | RTX 4090, RTX PRO 6000).
`--record [RUN]` records the printed tables for docs/accuracy.md (bench/_figures.py; the doc quotes several runs:
docs/figures/device_ops_logo-*.json name each run's command).
"""

from __future__ import annotations

import argparse
import time

import pandas as pd
from _figures import add_record_option, figure_key, record_if_asked

from perfmodel.evaluation.device_ops import error_table, leave_one_device_out, op_class_mape, training_rows
from perfmodel.hardware.catalog import load_catalog
from perfmodel.lowering.ops import OP_CLASSES
from perfmodel.regressors.device_ops import DeviceOpRegressor
from perfmodel.store import ProfileStore


def by_class_and_device(column: pd.Series) -> dict:
    """An `error_table` column (op class x held-out GPU), for docs/figures."""
    out: dict = {}
    for (op_class, device), value in column.items():
        out.setdefault(figure_key(op_class), {})[figure_key(device)] = value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="store URL holding `perfmodel import neusight` rows")
    parser.add_argument("--sources", default="neusight", help="comma-separated sources to train on")
    parser.add_argument("--dtype", default="fp32", help="evaluate the held-out GPU's rows of this dtype "
                        "(fp16: vidur's A100-80GB and A40 rows; training keeps every dtype of the other GPUs)")
    parser.add_argument("--holdout-source", default="neusight", help="hold out the GPUs of this source")
    parser.add_argument("--max-rows-per-class", type=int, default=40000)
    parser.add_argument("--n-estimators", type=int, default=DeviceOpRegressor().n_estimators)
    parser.add_argument("--max-depth", type=int, default=DeviceOpRegressor().max_depth)
    parser.add_argument("--nthread", type=int, default=1, help="XGBoost threads (default 1)")
    parser.add_argument("--calibration-rows", type=int, default=2000,
                        help="rows per class of the inner leave-one-GPU-out fit that sets the interval")
    parser.add_argument("--devices", help="comma-separated GPUs to hold out (default: every GPU of the source)")
    add_record_option(parser)
    args = parser.parse_args()

    catalog = load_catalog()
    with ProfileStore(args.store) as store:
        measured = store.op_measurements(source=args.sources.split(","), extra=False)
    ops = training_rows(measured)
    ops = ops[ops["op_class"].isin(OP_CLASSES)]
    evaluated = (ops["source"] == args.holdout_source) & (ops["dtype"] == args.dtype)
    devices = sorted(set(ops.loc[evaluated, "device"]))
    if args.devices:
        devices = [d for d in devices if d in args.devices.split(",")]
    print(f"{len(ops)} rows of {ops['device'].nunique()} devices ({', '.join(sorted(set(ops['dtype'])))}); "
          f"holding out {devices}, evaluating their {args.dtype} rows of {args.holdout_source}")
    started = time.perf_counter()
    predictions = leave_one_device_out(
        ops, catalog, lambda: DeviceOpRegressor(n_estimators=args.n_estimators, max_depth=args.max_depth,
                                                max_rows_per_class=args.max_rows_per_class, nthread=args.nthread,
                                                calibration_rows=args.calibration_rows),
        devices=devices, progress=print)
    predictions = predictions[(predictions["source"] == args.holdout_source) & (predictions["dtype"] == args.dtype)]
    print(f"fit + predict: {time.perf_counter() - started:.0f} s\n")
    table = error_table(predictions)
    pd.set_option("display.width", 160)
    print("MAPE % per op class (rows) × held-out GPU (columns):")
    print(table["mape_pct"].unstack().round(1).to_string())
    print("\n80 % interval coverage:")
    print(table["coverage"].unstack().round(2).to_string())
    print("\nMAPE % per op class (mean over held-out GPUs):")
    print(op_class_mape(predictions).round(1).to_string())
    record_if_asked(args, "device_ops_logo", {
        "mape_pct": by_class_and_device(table["mape_pct"]), "coverage": by_class_and_device(table["coverage"]),
        "op_class_mape_pct": {figure_key(k): v for k, v in op_class_mape(predictions).items()}})


if __name__ == "__main__":
    main()

"""Few-shot adaptation of the per-op device model, measured leave-one-GPU-out on the public sweeps.

    .venv/bin/python bench/few_shot.py --store sqlite:////tmp/gpu-ops-v3.db [--quick]

For each held-out GPU (NeuSight's fp32 sweeps: A100-40GB, P100, P4, T4, V100; its chip is held out of training,
`chip_of`), an `xgb-device-ops` model is fitted on the other GPUs' rows (smaller than the shipped one for time:
see the options; fitted models are cached under `--cache` as their own saved artifacts, UBJSON + JSON). Then for
n in 0, 25, 50, 100, 400 rows *per op class* of the held-out GPU, drawn at random (several seeds), a
`DeviceAdaptation` is fitted on those rows and the GPU's OTHER rows of that class are predicted. Printed: MAPE %
per op class × n (each device weighted equally, mean over seeds), its worst device, 80 % interval coverage and the
mean interval width (p90 / p10).

`--cpu-steps STORE`: the CPU as one more device. Whole training steps profiled on this host (`perfmodel profile
... --store STORE`, architectures outside the CPU corpus) against the predictions of (a) the device model adapted to
this CPU by `perfmodel hw bench --device cpu` (the adaptation in PERFMODEL_HOME) and (b) the promoted CPU iteration
model (xgb-ops, trained on this host's corpus).

`--quick`: one GPU (T4), two op classes, n = 0 and 25, one seed, 300 evaluated rows (a smoke test, ~1 min with a
cached model). `--record [RUN]` records the printed tables for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
from _figures import add_record_option, figure_key, record_if_asked

from perfmodel.evaluation.device_ops import chip_of, training_rows
from perfmodel.hardware.catalog import load_catalog
from perfmodel.lowering.ops import OP_CLASSES
from perfmodel.regressors.device_ops import DeviceOpRegressor
from perfmodel.store import ProfileStore

HELD_OUT = ("a100-pcie-40gb", "p100-pcie-16gb", "p4", "t4", "v100-pcie-32gb")
SHOTS = (0, 25, 50, 100, 400)


def base_model(device: str, ops: pd.DataFrame, catalog: dict, cache: Path, args: argparse.Namespace
               ) -> DeviceOpRegressor:
    """The device-ops model fitted without `device`'s chip (loaded from `cache` when fitted before with the same
    settings)."""
    tag = f"{device}-e{args.n_estimators}-r{args.max_rows_per_class}"
    directory = cache / tag
    if (directory / "manifest.json").exists():
        return DeviceOpRegressor.load(directory)
    train = ops[ops["device"].map(chip_of) != chip_of(device)]
    started = time.perf_counter()
    model = DeviceOpRegressor(n_estimators=args.n_estimators, max_rows_per_class=args.max_rows_per_class,
                              calibration_rows=args.calibration_rows, nthread=args.nthread).fit(train, catalog)
    model.save(directory)
    print(f"  fitted without {chip_of(device)}: {time.perf_counter() - started:.0f} s", flush=True)
    return model


def evaluate(device: str, model: DeviceOpRegressor, rows: pd.DataFrame, catalog: dict, shots: tuple[int, ...],
             seeds: int, max_eval: int) -> list[dict]:
    """One record per (op class, n, seed): MAPE, coverage and width over the device's rows not adapted on."""
    from perfmodel.regressors.adaptation import DeviceAdaptation

    records = []
    base = model.predict(rows, catalog)
    for op_class, class_rows in rows.groupby("op_class"):
        positions = rows.index.get_indexer(class_rows.index)
        for n in shots:
            if n and n + 50 > len(class_rows):
                continue
            for seed in range(seeds if n else 1):
                rng = np.random.default_rng(seed)
                order = rng.permutation(len(class_rows))
                fit_at, rest = order[:n], order[n:]
                if len(rest) > max_eval:
                    rest = rng.choice(rest, max_eval, replace=False)
                test = class_rows.iloc[rest]
                if n:
                    adaptation = DeviceAdaptation.fit(model, class_rows.iloc[fit_at], catalog, device=device)
                    out = adaptation.predict(model, test, catalog)
                    median, low, high = out.latency_ms, out.p10_ms, out.p90_ms
                else:
                    at = positions[rest]
                    median, low, high = base.latency_ms[at], base.p10_ms[at], base.p90_ms[at]
                measured = test["latency_ms"].to_numpy()
                records.append({
                    "device": device, "op_class": op_class, "n": n, "seed": seed,
                    "mape_pct": float(np.mean(np.abs(median - measured) / measured) * 100),
                    "coverage": float(np.mean((measured >= low) & (measured <= high))),
                    "width": float(np.exp(np.mean(np.log(high / low)))),
                })
    return records


def cpu_steps(store_url: str) -> None:
    """Measured CPU steps in `store_url` vs the adapted device model and the CPU iteration model."""
    from perfmodel.predictor.gpu_iteration import DevicePredictor
    from perfmodel.predictor.predict import Predictor
    from perfmodel.regressors.adaptation import AdaptedRegressor

    device = DevicePredictor.load()
    if not isinstance(device.regressor, AdaptedRegressor) or "cpu" not in device.regressor.devices:
        raise SystemExit("no adaptation of `cpu` in PERFMODEL_HOME: run `perfmodel hw bench --device cpu` first")
    iteration = Predictor.load()
    records = []
    with ProfileStore(store_url) as store:
        for summary in store.list(device="cpu"):
            profile = store.get(summary.id)
            stats = profile.iteration
            if stats is None or stats.iter_time_ms_median is None:
                continue
            adapted = device.predict(profile.job, "cpu")
            plain = iteration.predict(profile.job, "cpu")
            records.append({"job_name": profile.job.name, "batch": profile.job.batch_size,
                            "measured_ms": stats.iter_time_ms_median, "cv": stats.iter_time_cv,
                            "adapted_ms": adapted.iter_time_ms,
                            "adapted_p10_ms": adapted.interval_ms[0], "adapted_p90_ms": adapted.interval_ms[1],
                            "cpu_model_ms": plain.iter_time_ms})
    frame = pd.DataFrame.from_records(records)
    for name in ("adapted", "cpu_model"):
        frame[f"{name}_err_pct"] = (frame[f"{name}_ms"] / frame["measured_ms"] - 1) * 100
    pd.set_option("display.width", 200)
    print(frame.round(2).to_string(index=False))
    print(f"\nMAPE: adapted device model {frame['adapted_err_pct'].abs().mean():.1f} %, "
          f"CPU iteration model {frame['cpu_model_err_pct'].abs().mean():.1f} % ({len(frame)} steps)")


def by_class_and_n(table: pd.Series) -> dict:
    """A (op class, n) -> value table as printed, for docs/figures: {op class: {"n25": value, ...}}."""
    out: dict = {}
    for (op_class, n), value in table.items():
        out.setdefault(figure_key(op_class), {})[f"n{n}"] = value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", help="store URL holding the five public sources")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--devices", default=",".join(HELD_OUT))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-eval", type=int, default=2000, help="evaluated rows per class and draw")
    parser.add_argument("--n-estimators", type=int, default=150)
    parser.add_argument("--max-rows-per-class", type=int, default=20000)
    parser.add_argument("--calibration-rows", type=int, default=1000)
    parser.add_argument("--nthread", type=int, default=1)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/perfmodel-few-shot"))
    parser.add_argument("--fit-only", action="store_true", help="fit (and cache) the held-out models, no table")
    parser.add_argument("--quick", action="store_true", help="smoke test: T4, bmm and linear, n = 0, 25")
    parser.add_argument("--cpu-steps", metavar="STORE", help="compare CPU steps profiled into STORE instead")
    add_record_option(parser)
    args = parser.parse_args()
    if args.cpu_steps:
        cpu_steps(args.cpu_steps)
        return

    devices = args.devices.split(",")
    shots, classes = SHOTS, OP_CLASSES
    if args.quick:
        devices, shots, classes, args.seeds, args.max_eval = ["t4"], (0, 25), ("bmm", "linear"), 1, 300
    catalog = load_catalog()
    with ProfileStore(args.store) as store:
        ops = training_rows(store.op_measurements(extra=False))
    ops = ops[ops["op_class"].isin(OP_CLASSES)].reset_index(drop=True)
    records = []
    for device in devices:
        print(f"{device}:", flush=True)
        model = base_model(device, ops, catalog, args.cache, args)
        if args.fit_only:
            continue
        rows = ops[(ops["device"] == device) & (ops["dtype"] == args.dtype) & ops["op_class"].isin(classes)]
        records += evaluate(device, model, rows.reset_index(drop=True), catalog, shots, args.seeds, args.max_eval)
    if args.fit_only:
        return
    frame = pd.DataFrame.from_records(records)
    per_device = frame.groupby(["op_class", "n", "device"])[["mape_pct", "coverage", "width"]].mean()
    pd.set_option("display.width", 160)
    print(f"\nMAPE % per op class (rows) x adaptation rows per class (columns), mean over {len(devices)} held-out "
          f"GPUs and {args.seeds} seeds:")
    print(per_device["mape_pct"].groupby(["op_class", "n"]).mean().unstack().round(1).to_string())
    print("\nworst held-out GPU, MAPE %:")
    print(per_device["mape_pct"].groupby(["op_class", "n"]).max().unstack().round(1).to_string())
    print("\nMAPE % per held-out GPU at each n (all classes):")
    print(per_device["mape_pct"].unstack("n").round(1).to_string())
    print("\n80 % interval coverage:")
    print(per_device["coverage"].groupby(["op_class", "n"]).mean().unstack().round(2).to_string())
    print("\ninterval width p90/p10 (geometric mean):")
    print(per_device["width"].groupby(["op_class", "n"]).mean().unstack().round(2).to_string())
    per_gpu: dict = {}
    for (op_class, n, device), value in per_device["mape_pct"].items():
        per_gpu.setdefault(figure_key(device), {}).setdefault(figure_key(op_class), {})[f"n{n}"] = value
    record_if_asked(args, "few_shot", {
        "mape_pct": by_class_and_n(per_device["mape_pct"].groupby(["op_class", "n"]).mean()),
        "worst_gpu_mape_pct": by_class_and_n(per_device["mape_pct"].groupby(["op_class", "n"]).max()),
        "coverage": by_class_and_n(per_device["coverage"].groupby(["op_class", "n"]).mean()),
        "per_gpu_mape_pct": per_gpu})


if __name__ == "__main__":
    main()

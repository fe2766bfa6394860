"""Recurrent layers (cuDNN LSTM, GRU and vanilla RNN) as the per-op model prices them, against DeepBench.

    perfmodel import deepbench ../shared/datasets/deepbench --store sqlite:////tmp/gpu-ops.db
    .venv/bin/python bench/rnn_layers.py --store sqlite:////tmp/gpu-ops.db

A job's recurrent layer is lowered to cuDNN's kernels (`perfmodel.lowering.rows`): the input projection as one GEMM
over every position, then the recurrence one step at a time, a small GEMM on the hidden state and the gates'
pointwise kernel per step, and the recurrent weight's gradient as one GEMM. The per-op model (`xgb-device-ops`)
prices each kernel; it was never fitted on a recurrent layer. DeepBench times whole recurrent layers with cuDNN
on nine GPUs (Maxwell to Volta, two AMD), forward, backward through the data and backward to the weights,
hidden 256-4096, batch 1-128, 25-1500 steps. Its layers skip the input projection (its FLOP counts are those of the
recurrent GEMMs alone: 2 x steps x batch x gates x hidden^2 forward), so this bench prices the recurrence alone
(`recurrent_rows`) and its weight gradient, and compares layer by layer.

The step kernels are priced at `LIBRARY_LAUNCH_SHARE` of what the per-op model gives the same kernel launched
alone from eager PyTorch (cuDNN launches them back to back). That share was fitted on these layers (`--fit`: the
median over NVIDIA's recurrences, and the same held out by GPU), so the figures as priced are in-sample for NVIDIA;
the held-out column is the honest one.

Prints the ratio predicted / measured (median, per layer kind and phase, and per GPU) and the MAPE of the
layer's time, as priced and as eager kernels; and for DeepBench's fp16 layers (V100, P100) the fp16 / fp32 speed-up
of the same layer, measured and priced with and without the half-precision bound of training steps (`HALF_TYPES` in
`perfmodel.predictor.gpu_iteration`: a half kernel no faster than its fp32 twin by more than their rooflines
differ), a check nothing was fitted on. `--record [RUN]` records them for docs/accuracy.md
(bench/_figures.py).
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
from _figures import add_record_option, figure_key, record_if_asked

from perfmodel.core import accuracy
from perfmodel.lowering.ops import SHAPE_COLUMNS
from perfmodel.lowering.rows import BACKWARD, EAGER, FORWARD, LIBRARY, Row, linear_row, recurrent_rows
from perfmodel.predictor.gpu_iteration import DevicePredictor, priced_with_fp32_twins
from perfmodel.regressors.device_ops import LIBRARY_LAUNCH_SHARE
from perfmodel.store import ProfileStore

GATES = {"lstm": 4, "gru": 3, "vanilla_rnn": 1}  # gate blocks of each cell: the recurrent GEMM is gates x hidden wide
# DeepBench's phases -> the parts of a layer they time: the recurrence forward, the recurrence backward through the
# data, the recurrent weight's gradient, or both backward parts in one time
PHASES = {"forward": ("recurrence",), "backward_data": ("recurrence",), "backward_weight": ("weight gradient",),
          "backward": ("recurrence", "weight gradient")}


def layer_rows(kind: str, hidden: int, batch: int, steps: int, phase: str) -> list[Row]:
    """The kernels DeepBench's `phase` of one recurrent layer runs, as the lowering prices a layer."""
    width = GATES[kind] * hidden
    backward = phase != "forward"
    rows: list[Row] = []
    if "recurrence" in PHASES[phase]:
        rows += recurrent_rows(width, hidden, batch, steps, backward, "w1")
    if "weight gradient" in PHASES[phase]:
        rows.append(linear_row(width, hidden, batch * steps, "w1.dW"))
    return rows


def priced(layers: pd.DataFrame, predictor: DevicePredictor) -> pd.DataFrame:
    """Predicted ms of every DeepBench layer (its rows' sums), all layers in one call of the per-op model:
    `predicted_ms` as served, `eager_ms` with every kernel priced as if launched alone from eager PyTorch, and
    `library_eager_ms` the eager price of the kernels a library launches (cuDNN's steps)."""
    records, owner = [], []
    for i, layer in enumerate(layers.itertuples(index=False)):
        phase = BACKWARD if layer.phase != "forward" else FORWARD
        for row in layer_rows(layer.op_name, int(layer.hidden), int(layer.batch), int(layer.seq_len), layer.phase):
            records.append({"op_class": row.op_class, "op_name": row.op_name, "part": row.part, "phase": phase,
                            "dtype": layer.dtype, "math": layer.dtype, "device": layer.device, "launch": row.launch,
                            **{f: int(row.shape.get(f, 0)) for f in SHAPE_COLUMNS}})
            owner.append(i)
    frame = pd.DataFrame.from_records(records)
    in_training = np.ones(len(frame), dtype=bool)  # the layers as a training step's lowering prices them

    def price(rows: pd.DataFrame) -> np.ndarray:
        return priced_with_fp32_twins(predictor.regressor, rows, predictor.catalog, in_training).latency_ms

    served, eager = price(frame), price(frame.assign(launch=EAGER))
    unbounded = predictor.regressor.predict(frame, predictor.catalog).latency_ms
    library = (frame["launch"] == LIBRARY).to_numpy()

    def per_layer(ms: np.ndarray) -> np.ndarray:
        return np.bincount(np.asarray(owner), weights=ms, minlength=len(layers))

    return pd.DataFrame({"predicted_ms": per_layer(served), "eager_ms": per_layer(eager),
                         "library_eager_ms": per_layer(np.where(library, eager, 0.0)),
                         "unbounded_ms": per_layer(unbounded)}, index=layers.index)


def half_gains(layers: pd.DataFrame) -> pd.DataFrame:
    """Per GPU with half-precision layers: how much faster the same layer (cell, phase, shape) runs in fp16 than in
    fp32, measured and as priced, with and without the half-precision bound (medians over the layers timed in
    both), and the fp16 layers' MAPE with and without it."""
    key = ["device", "op_name", "phase", "hidden", "batch", "seq_len"]
    columns = ["latency_ms", "predicted_ms", "unbounded_ms"]
    fp32 = layers[layers["dtype"] == "fp32"].groupby(key)[columns].mean()
    rows = []
    for device, half in layers[layers["dtype"] != "fp32"].groupby("device"):
        both = fp32.merge(half.groupby(key)[columns].mean(), left_index=True, right_index=True,
                          suffixes=("", "_half"))
        rows.append({"device": device, "layers": len(half),
                     "measured_gain": float((both["latency_ms"] / both["latency_ms_half"]).median()),
                     "predicted_gain": float((both["predicted_ms"] / both["predicted_ms_half"]).median()),
                     "unbounded_gain": float((both["unbounded_ms"] / both["unbounded_ms_half"]).median()),
                     "mape_pct": float(half["ape"].mean()),
                     "unbounded_mape_pct": float(np.mean(accuracy.ape_pct(half["unbounded_ms"],
                                                                          half["latency_ms"])))})
    return pd.DataFrame(rows).set_index("device") if rows else pd.DataFrame()


def fitted_share(layers: pd.DataFrame) -> float:
    """The share of their eager price that `layers`' recurrences (forward, backward through the data: every kernel
    a library launch) cost: the median of measured / priced eager."""
    recurrences = layers[layers["phase"].isin(["forward", "backward_data"])]
    return float(np.exp(np.median(np.log(recurrences["latency_ms"] / recurrences["eager_ms"]))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="store URL holding `perfmodel import deepbench` rows")
    parser.add_argument("--fit", action="store_true", help="print the share of the eager price the NVIDIA "
                        "recurrences cost, fitted on every GPU and held out by GPU")
    add_record_option(parser)
    args = parser.parse_args()

    predictor = DevicePredictor.load()
    with ProfileStore(args.store) as store:
        measured = store.op_measurements(source=["deepbench"], extra=False)
    layers = measured[(measured["op_class"] == "rnn") & measured["op_name"].isin(list(GATES))
                      & measured["phase"].isin(list(PHASES)) & measured["device"].isin(list(predictor.catalog))
                      & (measured["latency_ms"] > 0)].dropna(subset=["hidden", "batch", "seq_len"])
    layers = layers.reset_index(drop=True)
    layers = layers.join(priced(layers, predictor))
    layers = layers.assign(ratio=layers["predicted_ms"] / layers["latency_ms"],
                           ape=accuracy.ape_pct(layers["predicted_ms"], layers["latency_ms"]),
                           eager_ape=accuracy.ape_pct(layers["eager_ms"], layers["latency_ms"]))
    vendor = layers["device"].map(lambda d: predictor.catalog[d].vendor)
    held_out: dict[str, dict[str, float]] = {}
    nvidia = layers[vendor == "NVIDIA"]
    for gpu in sorted(nvidia["device"].unique()):  # the share fitted without the GPU, on the GPU's layers
        share = fitted_share(nvidia[nvidia["device"] != gpu])
        own = nvidia[nvidia["device"] == gpu]
        mine = own["eager_ms"] - (1.0 - share) * own["library_eager_ms"]
        held_out[gpu] = {"share": share, "eager_mape_pct": float(own["eager_ape"].mean()),
                         "held_out_mape_pct": float(np.mean(accuracy.ape_pct(mine, own["latency_ms"])))}
    if args.fit:
        print(f"share of the eager price, fitted on every NVIDIA GPU: {fitted_share(nvidia):.3f} "
              f"(shipped: {LIBRARY_LAUNCH_SHARE})")
    print(f"{len(layers)} DeepBench recurrent layers on {layers['device'].nunique()} GPUs "
          f"({', '.join(sorted(layers['device'].unique()))}), priced with {predictor.model_version}\n")
    pd.set_option("display.width", 160)

    def summary(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
        grouped = frame.groupby(by)
        return pd.DataFrame({"layers": grouped.size(), "median_ratio": grouped["ratio"].median(),
                             "mape_pct": grouped["ape"].mean(), "median_ape_pct": grouped["ape"].median(),
                             "eager_mape_pct": grouped["eager_ape"].mean()})

    by_phase = summary(layers, ["phase"])
    by_kind = summary(layers, ["op_name", "phase"])
    by_gpu = summary(layers, ["device"])
    print("predicted / measured, per DeepBench phase (recurrence: forward, backward_data; weight gradient: "
          "backward_weight):")
    print(by_phase.round(2).to_string())
    print("\nper cell and phase:")
    print(by_kind.round(2).to_string())
    print("\nper GPU (every phase):")
    print(by_gpu.round(2).to_string())
    print("\nheld out by GPU (NVIDIA): the share fitted on the other GPUs, MAPE as eager kernels -> with it")
    for gpu, r in held_out.items():
        print(f"  {gpu:<16} {r['share']:.3f}  {r['eager_mape_pct']:5.1f} -> {r['held_out_mape_pct']:5.1f} %")
    eager_mean = float(np.mean([r["eager_mape_pct"] for r in held_out.values()]))
    held_mean = float(np.mean([r["held_out_mape_pct"] for r in held_out.values()]))
    print(f"  mean over {len(held_out)} GPUs: {eager_mean:.1f} -> {held_mean:.1f} %")
    gains = half_gains(layers)
    print("\nhalf-precision layers (DeepBench's fp16 sheets: V100 on tensor cores, P100's fp16 storage with fp32 "
          "math): fp16 / fp32 speed-up of the same layer (median), measured and as priced, and the fp16 layers' "
          "MAPE, with and without the bound that keeps a half kernel no faster than its fp32 twin by more than "
          "their rooflines differ:")
    print(gains.round(2).to_string())
    small = layers[(layers["hidden"] <= 512) & (layers["phase"] == "forward")]
    print(f"\nforward, hidden <= 512 ({len(small)} layers): median ratio {small['ratio'].median():.2f}, "
          f"MAPE {small['ape'].mean():.1f} %")
    record_if_asked(args, "rnn_layers", {
        "layers": len(layers), "gpus": int(layers["device"].nunique()),
        "by_phase": {figure_key(k): {"median_ratio": r.median_ratio, "mape_pct": r.mape_pct,
                                     "median_ape_pct": r.median_ape_pct, "eager_mape_pct": r.eager_mape_pct}
                     for k, r in by_phase.iterrows()},
        "by_gpu": {figure_key(k): {"median_ratio": r.median_ratio, "mape_pct": r.mape_pct,
                                   "eager_mape_pct": r.eager_mape_pct}
                   for k, r in by_gpu.iterrows()},
        "held_out_nvidia": {"eager_mape_pct": eager_mean, "mape_pct": held_mean,
                            "share_min": min(r["share"] for r in held_out.values()),
                            "share_max": max(r["share"] for r in held_out.values())},
        "forward_small_hidden": {"layers": len(small), "median_ratio": float(small["ratio"].median()),
                                 "mape_pct": float(small["ape"].mean())},
        "half": {figure_key(k): r.to_dict() for k, r in gains.iterrows()}})


if __name__ == "__main__":
    main()

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

Prints the ratio predicted / measured (median, per layer kind and phase, and per GPU) and the MAPE of the
layer's time. `--record [RUN]` records them for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
from _figures import add_record_option, figure_key, record_if_asked

from perfmodel.core import accuracy
from perfmodel.lowering.ops import SHAPE_COLUMNS
from perfmodel.lowering.rows import BACKWARD, FORWARD, Row, linear_row, recurrent_rows
from perfmodel.predictor.gpu_iteration import DevicePredictor
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


def priced(layers: pd.DataFrame, predictor: DevicePredictor) -> np.ndarray:
    """Predicted ms of every DeepBench layer (its rows' sum), all layers in one call of the per-op model."""
    records, owner = [], []
    for i, layer in enumerate(layers.itertuples(index=False)):
        phase = BACKWARD if layer.phase != "forward" else FORWARD
        for row in layer_rows(layer.op_name, int(layer.hidden), int(layer.batch), int(layer.seq_len), layer.phase):
            records.append({"op_class": row.op_class, "op_name": row.op_name, "part": row.part, "phase": phase,
                            "dtype": layer.dtype, "math": layer.dtype, "device": layer.device,
                            **{f: int(row.shape.get(f, 0)) for f in SHAPE_COLUMNS}})
            owner.append(i)
    frame = pd.DataFrame.from_records(records)
    latency = predictor.regressor.predict(frame, predictor.catalog).latency_ms
    return np.bincount(np.asarray(owner), weights=latency, minlength=len(layers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="store URL holding `perfmodel import deepbench` rows")
    add_record_option(parser)
    args = parser.parse_args()

    predictor = DevicePredictor.load()
    with ProfileStore(args.store) as store:
        measured = store.op_measurements(source=["deepbench"], extra=False)
    layers = measured[(measured["op_class"] == "rnn") & measured["op_name"].isin(list(GATES))
                      & measured["phase"].isin(list(PHASES)) & measured["device"].isin(list(predictor.catalog))
                      & (measured["latency_ms"] > 0)].dropna(subset=["hidden", "batch", "seq_len"])
    layers = layers.reset_index(drop=True)
    layers = layers.assign(predicted_ms=priced(layers, predictor))
    layers = layers.assign(ratio=layers["predicted_ms"] / layers["latency_ms"],
                           ape=accuracy.ape_pct(layers["predicted_ms"], layers["latency_ms"]))
    print(f"{len(layers)} DeepBench recurrent layers on {layers['device'].nunique()} GPUs "
          f"({', '.join(sorted(layers['device'].unique()))}), priced with {predictor.model_version}\n")
    pd.set_option("display.width", 160)

    def summary(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
        grouped = frame.groupby(by)
        return pd.DataFrame({"layers": grouped.size(), "median_ratio": grouped["ratio"].median(),
                             "mape_pct": grouped["ape"].mean(), "median_ape_pct": grouped["ape"].median()})

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
    small = layers[(layers["hidden"] <= 512) & (layers["phase"] == "forward")]
    print(f"\nforward, hidden <= 512 ({len(small)} layers): median ratio {small['ratio'].median():.2f}, "
          f"MAPE {small['ape'].mean():.1f} %")
    record_if_asked(args, "rnn_layers", {
        "layers": len(layers), "gpus": int(layers["device"].nunique()),
        "by_phase": {figure_key(k): {"median_ratio": r.median_ratio, "mape_pct": r.mape_pct,
                                     "median_ape_pct": r.median_ape_pct}
                     for k, r in by_phase.iterrows()},
        "by_gpu": {figure_key(k): {"median_ratio": r.median_ratio, "mape_pct": r.mape_pct}
                   for k, r in by_gpu.iterrows()},
        "forward_small_hidden": {"layers": len(small), "median_ratio": float(small["ratio"].median()),
                                 "mape_pct": float(small["ape"].mean())}})


if __name__ == "__main__":
    main()

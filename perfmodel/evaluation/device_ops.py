"""Leave-one-device-out validation of the per-op device regressor: for each device in the data, fit on the
other devices' rows and predict its rows. Errors per op class and per device; the held-out device is never in the
training rows (`leave_one_device_out` checks it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pandas as pd

from perfmodel.core import accuracy
from perfmodel.core.errors import PerfmodelError
from perfmodel.hardware.spec import HardwareSpec

if TYPE_CHECKING:
    from perfmodel.regressors.device_ops import OpPrediction

# upstream op classes the per-op regressor learns under another class: a plain GEMM is a bmm with batch 1; an RMS
# norm is a layer norm without the mean (same memory traffic)
OP_CLASS_ALIASES = {"gemm": "bmm", "rmsnorm": "layernorm"}
# dtypes whose peak the catalog gives (DeepBench's int8 inference kernels have no catalog peak: left out)
TRAINED_DTYPES = ("fp32", "fp16", "bf16")


# the shape columns a row of a class must have for its work to be stated (`lowering.ops.op_work`): a convolution row
# is square (`input_size`, `kernel_size`); an importer leaves them empty for a non-square one (DeepBench's speech
# convolutions: 161 x 700 inputs, 5 x 20 kernels), whose FLOPs would otherwise be counted as a 1 x 1 image's. The
# lowering prices such a convolution as its implicit GEMM (`lowering.rows`), never as a conv2d row.
REQUIRED_SHAPE: dict[str, tuple[str, ...]] = {"conv2d": ("input_size", "kernel_size", "stride")}


def stated(rows: pd.DataFrame) -> np.ndarray:
    """Which rows have every `REQUIRED_SHAPE` column of their class."""
    keep = np.ones(len(rows), dtype=bool)
    for op_class, columns in REQUIRED_SHAPE.items():
        of_class = (rows["op_class"] == op_class).to_numpy()
        for column in columns:
            present = rows[column].notna().to_numpy() if column in rows else np.zeros(len(rows), dtype=bool)
            keep &= ~of_class | present
    return keep


def training_rows(measurements: pd.DataFrame) -> pd.DataFrame:
    """Op measurements as the regressor's rows: forward ops of `TRAINED_DTYPES` only, aliased op classes,
    positive latency, every shape column their work needs (`REQUIRED_SHAPE`)."""
    rows = measurements
    if "dtype" in rows:
        rows = rows[rows["dtype"].isin(TRAINED_DTYPES)]
    if "phase" in rows:
        rows = rows[rows["phase"].isin(["forward", "total"])]
    rows = rows.assign(op_class=rows["op_class"].replace(OP_CLASS_ALIASES))
    rows = rows[(rows["latency_ms"] > 0).to_numpy() & stated(rows)]
    return rows.reset_index(drop=True)


_CHIP_PREFIXES = ("rtx", "gtx", "titan", "radeon", "xeon")


def chip_of(device: str) -> str:
    """The chip a catalog id names, without memory size, form factor or edition: a100-pcie-40gb -> a100,
    rtx-a6000 -> rtx-a6000, rtx-pro-6000-blackwell-server -> rtx-pro, mi210 -> mi210. Leave-one-GPU-out holds
    out a chip: vidur's A100-80GB rows never help predict NeuSight's A100-40GB."""
    parts = device.split("-")
    return "-".join(parts[:2]) if parts[0] in _CHIP_PREFIXES and len(parts) > 1 else parts[0]


class OpRegressor(Protocol):
    """What the held-out evaluation needs of an op regressor (`DeviceOpRegressor` is one)."""

    def fit(self, ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> OpRegressor: ...

    def predict(self, ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec]) -> OpPrediction: ...


def leave_one_device_out(ops: pd.DataFrame, catalog: Mapping[str, HardwareSpec],
                         make_regressor: Callable[[], OpRegressor],
                         devices: Sequence[str] | None = None,
                         progress: Callable[[str], None] | None = None,
                         group_of: Callable[[str], str] = chip_of) -> pd.DataFrame:
    """`ops` with `predicted_ms`, `p10_ms`, `p90_ms` and `extrapolated` columns, each row predicted by a regressor
    fitted without its device's group (`group_of`: its chip, by default). `devices`: those to hold out (default
    all); rows of other devices are only trained on."""
    held = list(devices) if devices is not None else sorted(set(ops["device"]))
    groups = ops["device"].map(group_of)
    out = []
    for device in held:
        if not (ops["device"] == device).any():
            raise PerfmodelError(f"no rows of device {device!r} to hold out")
        test = groups == group_of(device)
        train = ops[~test]
        if group_of(device) in set(train["device"].map(group_of)):
            raise AssertionError("leak: the held-out device's chip is in the training rows")
        regressor = make_regressor().fit(train, catalog)
        classes = set(getattr(regressor, "boosters_", {})) or set(ops["op_class"])
        rows = ops[(ops["device"] == device) & ops["op_class"].isin(classes)]
        predicted = regressor.predict(rows, catalog).frame(rows.index)
        out.append(pd.concat([rows, predicted], axis=1))
        if progress:
            progress(f"held out {device}: {len(rows)} rows predicted")
    return pd.concat(out)


def ape_pct(frame: pd.DataFrame) -> pd.Series:
    return pd.Series(accuracy.ape_pct(frame["predicted_ms"], frame["latency_ms"]), index=frame.index)


def error_table(predictions: pd.DataFrame, by: Sequence[str] = ("op_class", "device")) -> pd.DataFrame:
    """MAPE, median APE, rows and 80 % interval coverage per group."""
    frame = predictions.assign(ape=ape_pct(predictions),
                               covered=(predictions["latency_ms"] >= predictions["p10_ms"])
                               & (predictions["latency_ms"] <= predictions["p90_ms"]))
    grouped = frame.groupby(list(by))
    return pd.DataFrame({"rows": grouped.size(), "mape_pct": grouped["ape"].mean(),
                         "median_ape_pct": grouped["ape"].median(), "coverage": grouped["covered"].mean()})


def op_class_mape(predictions: pd.DataFrame) -> pd.Series:
    """MAPE per op class, each device weighted equally (mean of the per-device MAPEs)."""
    table = error_table(predictions)
    return table["mape_pct"].groupby(level="op_class").mean()


__all__ = ["OP_CLASS_ALIASES", "REQUIRED_SHAPE", "ape_pct", "chip_of", "error_table", "leave_one_device_out",
           "op_class_mape", "stated", "training_rows"]

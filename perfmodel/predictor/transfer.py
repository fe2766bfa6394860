"""Measured-profile transfer: per-op times measured on one accelerator, carried to another by the regressor's ratio.

A profile measured on device A says more about the job than the op shapes alone: it holds A's real kernels, launch
overheads and fusions. `transfer_ops` keeps that and asks the cross-device regressor only for the *relative* speed
of each op on B and on A:

    transferred_ms = measured_ms × predicted(B) / predicted(A)

per row, so errors the regressor makes alike on both devices (an op class it over-predicts everywhere, a shape it
has never seen) cancel, and a transfer from a device to itself returns the measured times exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.core.errors import PerfmodelError, UnknownNameError
from perfmodel.hardware.catalog import get_accelerator
from perfmodel.hardware.spec import HardwareSpec

MEASURED_COLUMN = "latency_ms"
TRANSFER_COLUMNS = ("target_device", "source_predicted_ms", "target_predicted_ms", "ratio", "transferred_ms",
                    "extrapolated")


def _catalog_ids(devices: pd.Series, catalog: Mapping[str, HardwareSpec], what: str) -> pd.Series:
    ids: dict[Any, str] = {}
    for name in devices.unique():
        if not isinstance(name, str) or not name:
            raise PerfmodelError(f"{what}: every row needs a device (a hardware-catalog name), got {name!r}")
        try:
            ids[name] = name if name in catalog else get_accelerator(name, catalog).name
        except UnknownNameError as exc:
            raise PerfmodelError(f"{what}: {exc}") from None
    return devices.map(ids)


def transfer_ops(measured: pd.DataFrame, target_device: str, regressor: Any,
                 catalog: Mapping[str, HardwareSpec]) -> pd.DataFrame:
    """`measured` (op rows of the regressor's schema, `device` = where each was measured, `latency_ms` = its
    measured time) carried to `target_device` (a catalog name or alias).

    Returns `measured` (index and columns kept, `device` as catalog ids) plus `target_device`,
    `source_predicted_ms` and `target_predicted_ms` (the regressor's medians on the measuring and the target
    device), `ratio` (their quotient), `transferred_ms` (= latency_ms × ratio) and `extrapolated` (the regressor
    flagged the row on either device). `regressor` is anything with `predict(ops, catalog) -> OpPrediction`
    (`perfmodel.regressors.device_ops.DeviceOpRegressor`)."""
    if MEASURED_COLUMN not in measured:
        raise PerfmodelError(f"the measured profile needs a {MEASURED_COLUMN!r} column (ms per row)")
    if "device" not in measured:
        raise PerfmodelError("the measured profile needs a 'device' column (where each row was measured)")
    latency = pd.to_numeric(measured[MEASURED_COLUMN], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~(latency >= 0)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise PerfmodelError(f"row {row + 1}: {MEASURED_COLUMN} must be a number ≥ 0, "
                             f"got {measured[MEASURED_COLUMN].iloc[row]!r}")
    try:
        target = get_accelerator(target_device, catalog).name
    except UnknownNameError as exc:
        raise PerfmodelError(f"target device: {exc}") from None

    source = measured.assign(device=_catalog_ids(measured["device"], catalog, "measured profile"))
    out = source.copy()
    if source.empty:
        for column in TRANSFER_COLUMNS:
            out[column] = pd.Series(dtype=bool if column == "extrapolated" else
                                    (str if column == "target_device" else np.float64))
        return out
    on_source = regressor.predict(source, catalog)
    on_target = regressor.predict(source.assign(device=target), catalog)
    ratio = np.asarray(on_target.latency_ms, dtype=np.float64) / np.asarray(on_source.latency_ms, dtype=np.float64)
    out["target_device"] = target
    out["source_predicted_ms"] = on_source.latency_ms
    out["target_predicted_ms"] = on_target.latency_ms
    out["ratio"] = ratio
    out["transferred_ms"] = latency * ratio
    out["extrapolated"] = np.asarray(on_source.extrapolated, dtype=bool) | np.asarray(on_target.extrapolated,
                                                                                         dtype=bool)
    return out

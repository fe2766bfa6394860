"""NeuSight-schema op tables -> rows of the cross-device per-op regressor (`perfmodel.regressors.device_ops`).

A NeuSight table (the op sweeps `data/dataset/train/collect/<op>/p2.1.0/<GPU>.csv.gz`, the test files
`data/dataset/test/*.csv`, or a user's own CSV of the same columns) has one op per row: `OPName`, `Device` and the
shape columns of the op:

| OPName | op_class | shape columns (NeuSight -> regressor) |
|---|---|---|
| bmm | bmm | B, M, N, K -> batch, m, n, k (B × (M×K · K×N)) |
| linear | linear | B, M, N, K -> batch, m, n, k ((B·M)×K input, N×K weight) |
| conv | conv2d | B, Input_Channel, Output_Channel, Kernel_Szie (sic; Kernel_Size too), Input_Size, Stride, Padding -> batch, in_channels, out_channels, kernel_size, input_size, stride, padding |
| add, addu, mul, mulu, div, divu, pow, powu, relu, gelu, tanh | elementwise | B, H -> batch, hidden |
| softmax | softmax | B, H -> batch, hidden |
| ln | layernorm | B, H -> batch, hidden |

`ops_from_neusight_frame` returns the regressor's schema (`op_class`, `op_name` = the OPName, `dtype`, `device` =
the hardware-catalog id of `Device`, every shape column, 0 where the op has none), index kept. `dtype` is fp32 (the
NeuSight sweeps are fp32) unless the table has a `dtype` column (fp32, fp16, bf16, or torch's float32, float16,
bfloat16). Column names are matched case-insensitively.

A bad row is a `PerfmodelError` naming the row (data rows count from 1; the header is not a row) and the column:
an unknown OPName, a Device the catalog lacks (with its closest names), a shape column the op needs that the table
lacks or leaves blank in that row, a shape that is not a whole number (≥ 1; padding ≥ 0), an unknown dtype.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.core.errors import PerfmodelError, UnknownNameError
from perfmodel.hardware.catalog import get_accelerator, load_catalog
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.lowering.ops import NEUSIGHT_OP_CLASS, NEUSIGHT_SHAPE_SOURCES, SHAPE_COLUMNS

# shape columns that may be 0 (every other one must be ≥ 1)
ZERO_ALLOWED = frozenset({"padding"})

OPNAME_COLUMN = "OPName"
DEVICE_COLUMN = "Device"
DTYPE_COLUMN = "dtype"
LATENCY_COLUMN = "Latency"

DTYPE_NAMES: Mapping[str, str] = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32", "f32": "fp32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16", "f16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
}

OP_COLUMNS = ("op_class", "op_name", "dtype", "device", *SHAPE_COLUMNS)


def _row_error(bad: np.ndarray, column: str, what: str) -> PerfmodelError:
    """An error naming the first bad row (1-based) and the column; how many more rows share the problem."""
    rows = np.flatnonzero(bad)
    more = f" (and {len(rows) - 1} more row(s))" if len(rows) > 1 else ""
    return PerfmodelError(f"row {rows[0] + 1}, column {column!r}: {what}{more}")


def _columns(frame: pd.DataFrame) -> dict[str, str]:
    """Lower-cased column name -> the column as the table spells it (the first of any duplicates)."""
    found: dict[str, str] = {}
    for column in frame.columns:
        found.setdefault(str(column).strip().lower(), column)
    return found


def _text(values: pd.Series) -> pd.Series:
    return values.astype("string").str.strip().fillna("")


def _resolve_devices(names: pd.Series, catalog: Mapping[str, HardwareSpec], column: str) -> pd.Series:
    ids: dict[str, str] = {}
    for name in names.unique():
        if not name:
            raise _row_error((names == "").to_numpy(), column, "no device given")
        try:
            ids[name] = get_accelerator(name, catalog).name
        except UnknownNameError as exc:
            raise _row_error((names == name).to_numpy(), column, str(exc)) from None
    return names.map(ids)


def _resolve_dtypes(values: pd.Series, column: str) -> pd.Series:
    lowered = values.str.lower()
    bad = ~lowered.isin(list(DTYPE_NAMES))
    if bad.any():
        first = values[bad.to_numpy()].iloc[0]
        raise _row_error(bad.to_numpy(), column,
                         f"unknown dtype {first!r}; known: {', '.join(sorted(set(DTYPE_NAMES.values())))}")
    return lowered.map(DTYPE_NAMES)


def ops_from_neusight_frame(frame: pd.DataFrame, catalog: Mapping[str, HardwareSpec] | None = None, *,
                            with_latency: bool = False) -> pd.DataFrame:
    """The rows of a NeuSight-schema table in the regressor's schema (`OP_COLUMNS`), index kept. `catalog`
    defaults to `load_catalog()`. `with_latency` adds `latency_ms` from the `Latency` column (training rows)."""
    catalog = load_catalog() if catalog is None else catalog
    columns = _columns(frame)
    n = len(frame)
    for required in (OPNAME_COLUMN, DEVICE_COLUMN, *((LATENCY_COLUMN,) if with_latency else ())):
        if required.lower() not in columns:
            raise PerfmodelError(f"the table has no {required!r} column "
                                 f"(columns: {', '.join(map(str, frame.columns))})")

    op_names = _text(frame[columns[OPNAME_COLUMN.lower()]])
    op_class = op_names.map(NEUSIGHT_OP_CLASS)
    unknown = op_class.isna().to_numpy()
    if unknown.any():
        name = op_names[unknown].iloc[0]
        close = difflib.get_close_matches(name, list(NEUSIGHT_OP_CLASS), n=3, cutoff=0.5)
        hint = f"did you mean: {', '.join(close)}?" if close else f"known: {', '.join(sorted(NEUSIGHT_OP_CLASS))}"
        raise _row_error(unknown, columns[OPNAME_COLUMN.lower()], f"unknown NeuSight op {name!r}; {hint}")

    device = _resolve_devices(_text(frame[columns[DEVICE_COLUMN.lower()]]), catalog, columns[DEVICE_COLUMN.lower()])
    if DTYPE_COLUMN.lower() in columns:
        dtype = _resolve_dtypes(_text(frame[columns[DTYPE_COLUMN.lower()]]), columns[DTYPE_COLUMN.lower()])
    else:
        dtype = pd.Series("fp32", index=frame.index)

    out = pd.DataFrame({"op_class": op_class.astype(str).to_numpy(), "op_name": op_names.astype(str).to_numpy(),
                        "dtype": dtype.astype(str).to_numpy(), "device": device.astype(str).to_numpy()},
                       index=frame.index)
    shapes = {name: np.zeros(n, dtype=np.int64) for name in SHAPE_COLUMNS}
    classes = out["op_class"].to_numpy()
    for cls, sources in NEUSIGHT_SHAPE_SOURCES.items():
        rows = classes == cls
        if not rows.any():
            continue
        for target, names in sources.items():
            source = next((columns[s.lower()] for s in names if s.lower() in columns), None)
            if source is None:
                raise _row_error(rows, names[0], f"op {op_names[rows].iloc[0]!r} needs column {names[0]!r} "
                                                        f"({target}), which the table does not have")
            values = pd.to_numeric(frame[source], errors="coerce").to_numpy(dtype=np.float64)
            blank = rows & ~np.isfinite(values)
            if blank.any():
                raise _row_error(blank, source, f"op {op_names[blank].iloc[0]!r} needs a number in {source!r} "
                                                       f"({target}); got {frame[source][blank].iloc[0]!r}")
            low = 0 if target in ZERO_ALLOWED else 1
            bad = rows & ((values != np.round(values)) | (values < low))
            if bad.any():
                raise _row_error(bad, source, f"{target} must be a whole number ≥ {low}; "
                                                     f"got {frame[source][bad].iloc[0]!r}")
            shapes[target][rows] = values[rows].astype(np.int64)
    for name in SHAPE_COLUMNS:
        out[name] = shapes[name]

    if with_latency:
        source = columns[LATENCY_COLUMN.lower()]
        latency = pd.to_numeric(frame[source], errors="coerce").to_numpy(dtype=np.float64)
        bad = ~(latency > 0)
        if bad.any():
            raise _row_error(bad, source, f"latency must be a positive number of ms; "
                                                 f"got {frame[source][bad].iloc[0]!r}")
        out["latency_ms"] = latency
    return out


def read_op_table(path: str | Path) -> pd.DataFrame:
    """A CSV (or .csv.gz, ...) of ops with every cell as written (strings; blanks as ""), so that the columns can
    be written back unchanged."""
    path = Path(path)
    if not path.is_file():
        raise PerfmodelError(f"no such file: {path}")
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError, UnicodeDecodeError) as exc:  # pandas' parser errors are ValueErrors
        raise PerfmodelError(f"cannot read {path} as CSV: {' '.join(str(exc).split())}") from None
    if frame.empty:
        raise PerfmodelError(f"{path} has no data rows")
    return frame

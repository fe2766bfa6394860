"""Per-op latency of a whole op table (`perfmodel predict-ops`): a CSV in NeuSight's schema (OPName, Device and the
op's shape columns) read, mapped to the device model's op rows and predicted by an `xgb-device-ops` model of the
registry, on any hardware-catalog accelerator. The answer is the table with four columns added
(`PREDICTION_COLUMNS`), written as CSV (compressed by its suffix) atomically."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfmodel.core.atomic import atomic_write
from perfmodel.core.errors import PerfmodelError

PREDICTION_COLUMNS = ("predicted_ms", "p10_ms", "p90_ms", "extrapolated")
_COMPRESSION = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zip": "zip", ".zst": "zstd"}


@dataclass(frozen=True)
class OpTablePrediction:
    """The input table joined with its predictions, the model that made them and the devices it covered."""

    frame: Any  # pandas.DataFrame: the table's columns + PREDICTION_COLUMNS
    model_ref: str
    devices: tuple[str, ...]

    @property
    def extrapolated(self) -> int:
        return int(self.frame["extrapolated"].sum())


def promoted_device_ops_model(models_dir: Path | None = None) -> tuple[Any, str] | tuple[None, None]:
    """The promoted `device-ops` regressor and its ref, or (None, None) when the registry promotes none."""
    from perfmodel.registry.registry import ModelRegistry
    from perfmodel.regressors import load_regressor

    registry = ModelRegistry(models_dir)
    if registry.promoted_ref("device-ops") is None:
        return None, None
    entry = registry.get(None, role="device-ops")
    return load_regressor(entry.path), entry.ref


def device_ops_model(ref: str | None, models_dir: Path | None = None) -> tuple[Any, str]:
    """The xgb-device-ops regressor `ref` names (NAME/VERSION or NAME), or the one promoted for `device-ops`."""
    from perfmodel.registry.registry import ModelRegistry
    from perfmodel.regressors import load_regressor

    registry = ModelRegistry(models_dir)
    if ref is None and registry.promoted_ref("device-ops") is None:
        raise PerfmodelError(f"no promoted device-ops model in {registry.root}: give --model NAME/VERSION (see "
                             "`perfmodel models list`) or promote an xgb-device-ops model with "
                             "`perfmodel models promote NAME/VERSION`")
    entry = registry.get(ref, role="device-ops")
    if entry.manifest.regressor != "xgb-device-ops":
        raise PerfmodelError(f"{entry.ref} is an {entry.manifest.regressor!r} model; predict-ops needs an "
                             "'xgb-device-ops' model (per op, any accelerator)")
    return load_regressor(entry.path), entry.ref


def predict_op_table(table: Path, model_ref: str | None = None) -> OpTablePrediction:
    """Every op of the table at `table` predicted on its device; refuses a table that already has a prediction
    column (it would be overwritten)."""
    from perfmodel.hardware.catalog import load_catalog
    from perfmodel.predictor.op_table import ops_from_neusight_frame, read_op_table

    frame = read_op_table(table)
    clash = [c for c in PREDICTION_COLUMNS if c in frame.columns]
    if clash:
        raise PerfmodelError(f"{table} already has column(s) {', '.join(clash)}: rename them (predict-ops adds them)")
    catalog = load_catalog()
    ops = ops_from_neusight_frame(frame, catalog)
    regressor, ref = device_ops_model(model_ref)
    predicted = regressor.predict(ops, catalog).frame(frame.index)
    return OpTablePrediction(frame.join(predicted), ref, tuple(sorted(ops["device"].unique())))


def write_csv_atomically(frame: Any, path: Path) -> Path:
    """`frame` as CSV at `path` (compressed by its suffix), atomically; `path`'s folder must exist."""
    compression = _COMPRESSION.get(path.suffix.lower())
    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False, compression=compression),
                        make_parents=False)

"""Training runs of the CLI (`perfmodel train`, `train-ops`, `evaluate`, `adapt`): where the training data comes
from, how a regressor is fitted on it (seeded) and saved to the registry (optionally promoted for its role), and the
device model's adaptation to one device from the rows a store holds for it.

The iteration-time regressors learn from profiles: a store (`--store`) or a Parquet export (`--profiles`, by default
the shipped `profiles/cpu-corpus`, loaded into an in-memory store). The per-op device model learns from imported op
measurements (`perfmodel import`)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from perfmodel.core.errors import PerfmodelError

Progress = Callable[[str], None]
DEVICE_OPS_SOURCES = ("neusight", "vidur", "deepbench", "llmservingsim", "phantora")


def _quiet(_message: str) -> None:
    return None


def training_samples(profiles: Path | None = None, store_url: str | None = None,
                     progress: Progress = _quiet) -> list[Any]:
    """The profiles' training samples: from the store at `store_url` when given, else from the Parquet export in
    `profiles` (default: `profiles/cpu-corpus` beside the models folder)."""
    from perfmodel.features.dataset import samples_from_store
    from perfmodel.store import ProfileStore

    if store_url is not None:
        with ProfileStore(store_url) as profile_store:
            return samples_from_store(profile_store, progress=progress)
    from perfmodel.registry.registry import default_models_dir

    directory = profiles or default_models_dir().parent / "profiles" / "cpu-corpus"
    with ProfileStore("sqlite://") as memory_store:  # an in-memory store of the export
        memory_store.import_parquet(directory)
        return samples_from_store(memory_store, progress=progress)


def seeded(cls: type, seed: int) -> Callable[[], Any]:
    """A factory passing `seed` to regressors that take one (the roofline baseline learns nothing)."""
    takes_seed = "seed" in inspect.signature(cls).parameters
    return functools.partial(cls, seed=seed) if takes_seed else cls


def train_iteration_model(regressor: str, samples: Sequence[Any], *, name: str | None = None, seed: int = 0,
                          promote: bool = False, models_dir: Path | None = None,
                          progress: Progress = _quiet) -> Any:
    """Fit the iteration-time regressor `regressor` on `samples` and save it to the registry as `name` (default:
    the regressor's name); promoted for the default role if asked. Returns the registry entry."""
    from perfmodel.registry.registry import ModelRegistry, training_domain
    from perfmodel.regressors import regressor_class

    cls = regressor_class(regressor, iteration=True)
    if not samples:
        raise PerfmodelError("no usable profiles to train on (need outcome ok with a per-op profile)")
    progress(f"training {regressor} on {len(samples)} profiles")
    fitted = seeded(cls, seed)().fit(list(samples))
    registry = ModelRegistry(models_dir)
    entry = registry.save(fitted, name or regressor, training_domain(samples))
    if promote:
        registry.promote(entry.ref)
    return entry


def train_device_ops_model(store_url: str | None, sources: Sequence[str] = DEVICE_OPS_SOURCES, *,
                           name: str = "xgb-device-ops", seed: int = 0, promote: bool = False,
                           models_dir: Path | None = None, estimator_settings: Mapping[str, Any] | None = None,
                           progress: Progress = _quiet) -> Any:
    """Fit the per-op device regressor (xgb-device-ops; `estimator_settings` override its constructor's defaults)
    on the op measurements the store holds from `sources` and save it to the registry as `name`; promoted for the
    device-ops role if asked. Returns the registry entry."""
    from perfmodel.evaluation.device_ops import training_rows
    from perfmodel.hardware.catalog import load_catalog
    from perfmodel.lowering.ops import OP_CLASSES
    from perfmodel.registry.registry import ModelRegistry
    from perfmodel.regressors.device_ops import DeviceOpRegressor
    from perfmodel.store import ProfileStore

    sources = list(sources)
    with ProfileStore(store_url) as profile_store:
        measured = profile_store.op_measurements(source=sources, extra=False)
    ops = training_rows(measured)
    ops = ops[ops["op_class"].isin(OP_CLASSES)]
    if ops.empty:
        raise PerfmodelError(f"the store has no op measurements of {','.join(sources)}: run "
                             "`perfmodel import SOURCE PATH` first")
    progress(f"training xgb-device-ops on {len(ops)} rows of {ops['device'].nunique()} devices")
    fitted = DeviceOpRegressor(**{"seed": seed, **(estimator_settings or {})}).fit(ops, load_catalog())
    registry = ModelRegistry(models_dir)
    domain = {"devices": sorted(set(ops["device"])), "sources": sources,
              "dtypes": sorted(set(ops["dtype"])), "op_classes": sorted(set(ops["op_class"]))}
    entry = registry.save(fitted, name, domain)
    if promote:
        registry.promote(entry.ref, role="device-ops")
    return entry


def fit_adaptation(device: str, store_url: str | None, catalog: dict[str, Any], progress: Progress = _quiet) -> Any:
    """Fit and save (under PERFMODEL_HOME/adaptations/<device>/) the promoted device model's adaptation to `device`
    from every row the store holds for it; returns it."""
    from perfmodel.engine.op_table import promoted_device_ops_model
    from perfmodel.evaluation.device_ops import training_rows
    from perfmodel.regressors.adaptation import DeviceAdaptation, adaptations_dir
    from perfmodel.store import ProfileStore

    model, ref = promoted_device_ops_model()
    if model is None:
        raise PerfmodelError("no promoted device-ops model to adapt (see `perfmodel models list`)")
    with ProfileStore(store_url) as store:
        rows = training_rows(store.op_measurements(device=device))  # `extra`: the part a real op's row times
    rows = rows[rows["op_class"].isin(set(model.boosters_))]
    if rows.empty:
        raise PerfmodelError(f"the store holds no measured ops of {device!r}: run `perfmodel hw bench` first")
    adaptation = DeviceAdaptation.fit(model, rows, catalog, device=device)
    directory = adaptations_dir() / device
    adaptation.save(directory)
    counts = ", ".join(f"{c} {n}" for c, n in adaptation.rows_per_class.items())
    progress(f"adapted {ref} to {device} ({counts} rows): {directory}")
    return adaptation

"""The retraining job (`perfmodel retrain`): champion/challenger over everything in the store, safe from cron.

For each model role of the registry (`cpu-step`: iteration time from profiles; `device-ops`: per-op latency from op
measurements) a `RoleRecipe` says how to read the role's data from the store, how to group it for a held-out split
(by model family for profiles, by chip for op measurements: a group is never in train and test at once) and how to
fit the regressor. One run:

1. takes an exclusive lock (`<models>/.retrain.lock`): two runs never overlap; a second one fails at once;
2. per role, hashes the training data (sorted row identities and the recipe): the same hash as the promoted model's
   manifest, or as the last run's decision for the role (`<models>/retrain-state.json`), is "no new data": kept,
   nothing trained, no new version;
3. splits the groups deterministically (sorted by a seeded hash of their name; `holdout_fraction` of them, at least
   one, never all) and fits the challenger on the training groups. The champion (the promoted model) and the
   challenger predict the SAME held-out rows; MAPE (per held-out group, then averaged: each chip or family counts
   once) is compared on the rows both can predict. The champion may have
   been trained on the held-out rows (the report says so when its domain shows it): the comparison then favours the
   champion, so a promotion is never flattered;
4. replaces a champion only on enough held-out evidence: at least `MIN_COMPARED_ROWS` rows of at least
   `MIN_COMPARED_GROUPS` groups that both models predict (else the champion is kept and the report says why), and
   only with a challenger whose held-out MAPE beats the champion's by `min_improvement_pct` (relative); a role
   without a champion promotes its first candidate. The promoted artifact is refitted on all the role's data,
   written to a temporary folder and renamed to the next version (a crash leaves no partial version), recorded as
   a `promoted` model event in the store (detail: JSON with the role and `"by": "retrain"`), which services and
   `perfmodel predict` on the store follow, and written to the registry's `promoted.json`.

The champion of a role is what the store promotes (its newest `promoted` event for the role, else `promoted.json`):
the model a service on the same store serves. The registry folder must exist: a run never creates one.

Observations posted to the service are read and summarised in the report (per accelerator: count and MAPE of the
throughput predicted then); they are whole-placement throughputs, used online by calibration, not a training signal
of either role.

Exit status of the command (`RetrainResult.exit_code`): 0 a model was promoted, 3 every role kept its champion (or
had no new data), 1 failed (a role failed, the store could not be read, or another run holds the lock).
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import os
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from perfmodel.core.atomic import write_json_atomically
from perfmodel.core.errors import PerfmodelError
from perfmodel.registry.files import new_folder
from perfmodel.registry.registry import DOMAIN_FILE, ModelRegistry
from perfmodel.regressors import regressor_class as _regressor_class
from perfmodel.regressors.manifest import Manifest, data_hash

if TYPE_CHECKING:
    from perfmodel.hardware.spec import HardwareSpec
    from perfmodel.store.jobs import JobStore

LOCK_FILE = ".retrain.lock"
STATE_FILE = "retrain-state.json"
_TMP_PREFIX = ".retrain-tmp-"

# The least held-out evidence on which a challenger may replace a champion: rows both models predict, and groups
# (chips, model families) they come from. Below it the champion is kept, whatever the MAPEs say: a few rows, or one
# chip or family, say little about the others.
MIN_COMPARED_ROWS = 10
MIN_COMPARED_GROUPS = 2

EXIT_PROMOTED = 0
EXIT_FAILED = 1
EXIT_KEPT = 3

Decision = Literal["promoted", "kept", "failed"]
Progress = Callable[[str], None]


class RetrainLockedError(PerfmodelError):
    """Another retrain run holds the lock."""


@dataclass(frozen=True)
class RetrainSettings:
    """What a run does. `regressors`: role -> regressor kind of the challenger (default: the champion's kind, else
    the role's default); `estimator_settings`: role -> settings overriding the champion's (e.g. fewer trees)."""

    min_improvement_pct: float = 2.0  # the challenger's held-out MAPE must be this % (relative) below the champion's
    holdout_fraction: float = 0.25  # of the groups (families / chips), at least one, never all
    # the least held-out evidence on which a challenger may replace a champion (rows both predict, and their groups)
    min_compared_rows: int = MIN_COMPARED_ROWS
    min_compared_groups: int = MIN_COMPARED_GROUPS
    seed: int = 0
    roles: tuple[str, ...] = ("cpu-step", "device-ops")  # the whole-step stage is fitted by bench/real_runs.py
    regressors: Mapping[str, str] = field(default_factory=dict)
    estimator_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    force: bool = False  # evaluate even when the data hash is unchanged
    # with the whole-step role: write the GPU accuracy report (`perfmodel report gpu-accuracy`) of the store's
    # whole-job runs here after the role ran
    gpu_report_dir: Path | None = None

    def __post_init__(self) -> None:
        if not 0 < self.holdout_fraction < 1:
            raise PerfmodelError(f"holdout_fraction must be in (0, 1), got {self.holdout_fraction}")
        if self.min_compared_rows < 1 or self.min_compared_groups < 1:
            raise PerfmodelError(f"min_compared_rows and min_compared_groups must be at least 1, got "
                                 f"{self.min_compared_rows} and {self.min_compared_groups}")
        if not 0 <= self.min_improvement_pct < 100:
            raise PerfmodelError(f"min_improvement_pct must be in [0, 100), got {self.min_improvement_pct}")
        unknown = sorted(set(self.roles) - set(RECIPES))
        if unknown or not self.roles:
            raise PerfmodelError(f"unknown role(s) {unknown}: choose from {', '.join(RECIPES)}")
        for option, values in (("regressor", self.regressors), ("set", self.estimator_settings)):
            unknown = sorted(set(values) - set(RECIPES))
            if unknown:
                raise PerfmodelError(f"--{option}: unknown role(s) {unknown}: choose from {', '.join(RECIPES)}")
        for role, regressor in self.regressors.items():
            RECIPES[role].check_regressor(regressor)


# --- the roles' recipes ---------------------------------------------------------------------------------------------


@dataclass
class RoleData:
    """A role's rows: `rows` (a DataFrame or a list of Samples), their group names and measured ms, in one order."""

    rows: Any
    groups: np.ndarray
    measured_ms: np.ndarray
    keys: list[str]
    notes: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.groups)


class RoleRecipe(ABC):
    """How one role learns: read, group, fit, predict, describe. Subclasses fill it in for their regressor."""

    role: str
    default_regressor: str
    group_by: str

    @classmethod
    def regressors(cls) -> tuple[str, ...]:
        """The regressor kinds this role learns with."""
        return (cls.default_regressor,)

    @classmethod
    def check_regressor(cls, regressor: str) -> None:
        """PerfmodelError unless the role learns with `regressor`."""
        if regressor not in cls.regressors():
            raise PerfmodelError(f"role {cls.role} does not learn with regressor {regressor!r}: choose from "
                                 f"{', '.join(cls.regressors())}")

    @abstractmethod
    def load(self, store: JobStore, catalog: Mapping[str, HardwareSpec], progress: Progress) -> RoleData:
        """The role's rows from the store (only reads it)."""

    @abstractmethod
    def subset(self, data: RoleData, mask: np.ndarray) -> Any:
        """The rows of `data` where `mask` holds, in the regressor's input form."""

    @abstractmethod
    def fit(self, regressor: str, settings: Mapping[str, Any], rows: Any, catalog: Mapping[str, HardwareSpec]) -> Any:
        """A fitted regressor of kind `regressor`."""

    @abstractmethod
    def predict_ms(self, model: Any, rows: Any, catalog: Mapping[str, HardwareSpec]) -> tuple[np.ndarray, np.ndarray]:
        """(predicted ms, mask of rows the model can predict), one per row."""

    @abstractmethod
    def domain(self, rows: Any) -> dict[str, Any]:
        """What the rows cover (the registry's domain.json of a saved version)."""

    def seen_groups(self, domain: Mapping[str, Any]) -> set[str] | None:
        """The groups a champion with training `domain` was trained on (None: its domain does not say)."""
        return None

    def champion_saw(self, domain: Mapping[str, Any], held_out_groups: Sequence[str]) -> bool | None:
        """Whether a champion with training `domain` was trained on any held-out group (None: cannot tell)."""
        seen = self.seen_groups(domain)
        return None if seen is None else bool(seen & set(held_out_groups))


class DeviceOpsRecipe(RoleRecipe):
    """`device-ops`: the per-op device model on every op measurement (imported or benchmarked), held out by chip."""

    role = "device-ops"
    default_regressor = "xgb-device-ops"
    group_by = "chip"

    def load(self, store: JobStore, catalog: Mapping[str, HardwareSpec], progress: Progress) -> RoleData:
        from perfmodel.evaluation.device_ops import chip_of, training_rows
        from perfmodel.lowering.ops import OP_CLASSES

        measured = store.op_measurements(extra=False)
        ops = training_rows(measured)
        ops = ops[ops["op_class"].isin(OP_CLASSES)]
        unknown = sorted(set(ops["device"]) - set(catalog))
        if unknown:
            progress(f"device-ops: left out rows of devices the catalog lacks: {unknown}")
            ops = ops[ops["device"].isin(list(catalog))]
        ops = ops.reset_index(drop=True)
        groups = ops["device"].map(chip_of).to_numpy(dtype=object)
        return RoleData(rows=ops, groups=groups, measured_ms=ops["latency_ms"].to_numpy(dtype=np.float64),
                        keys=[str(u) for u in ops["uid"]],
                        notes={"op_measurements_in_store": int(len(measured)), "devices": int(ops["device"].nunique()),
                               "left_out_devices": unknown})

    def subset(self, data: RoleData, mask: np.ndarray) -> Any:
        return data.rows[mask].reset_index(drop=True)

    def fit(self, regressor: str, settings: Mapping[str, Any], rows: Any, catalog: Mapping[str, HardwareSpec]) -> Any:
        from perfmodel.regressors import regressor_class

        self.check_regressor(regressor)
        cls = regressor_class(regressor)
        unknown = sorted(set(settings) - set(inspect.signature(cls).parameters))
        if unknown:
            raise PerfmodelError(f"{regressor} takes no setting(s) {unknown}")
        return cls(**settings).fit(rows, catalog)

    def predict_ms(self, model: Any, rows: Any, catalog: Mapping[str, HardwareSpec]) -> tuple[np.ndarray, np.ndarray]:
        known = rows["op_class"].isin(list(getattr(model, "boosters_", {}))).to_numpy()
        predicted = np.full(len(rows), np.nan)
        if known.any():
            predicted[known] = model.predict(rows[known], catalog).latency_ms
        return predicted, known

    def domain(self, rows: Any) -> dict[str, Any]:
        return {"devices": sorted(set(rows["device"])), "sources": sorted(set(rows["source"])),
                "dtypes": sorted(set(rows["dtype"])), "op_classes": sorted(set(rows["op_class"]))}

    def seen_groups(self, domain: Mapping[str, Any]) -> set[str] | None:
        from perfmodel.evaluation.device_ops import chip_of

        devices = domain.get("devices")
        return None if devices is None else {chip_of(d) for d in devices}


class IterationRecipe(RoleRecipe):
    """`cpu-step`: the iteration-time model on every stored profile with a per-op profile, held out by family."""

    role = "cpu-step"
    default_regressor = "xgb-ops"
    group_by = "family"

    def __init__(self, graph_cache_dir: Path | None = None):
        self.graph_cache_dir = graph_cache_dir

    @classmethod
    def regressors(cls) -> tuple[str, ...]:
        from perfmodel.regressors import ITERATION_REGRESSORS

        return ITERATION_REGRESSORS

    def load(self, store: JobStore, catalog: Mapping[str, HardwareSpec], progress: Progress) -> RoleData:
        from perfmodel.features.dataset import samples_from_store

        samples = samples_from_store(store, graph_cache_dir=self.graph_cache_dir, progress=progress)
        return RoleData(rows=samples, groups=np.array([s.family for s in samples], dtype=object),
                        measured_ms=np.array([s.iter_time_ms for s in samples], dtype=np.float64),
                        keys=[f"{s.profile_id}|{s.spec.key()}|{s.hardware.name}|{s.iter_time_ms!r}"
                              for s in samples],
                        notes={"profiles_in_store": store.count(), "families": len(set(s.family for s in samples))})

    def subset(self, data: RoleData, mask: np.ndarray) -> Any:
        return [s for s, keep in zip(data.rows, mask) if keep]

    def fit(self, regressor: str, settings: Mapping[str, Any], rows: Any, catalog: Mapping[str, HardwareSpec]) -> Any:
        import inspect

        from perfmodel.regressors import regressor_class

        cls = regressor_class(regressor, iteration=True)
        accepted = inspect.signature(cls).parameters
        unknown = sorted(set(settings) - set(accepted))
        if unknown:
            raise PerfmodelError(f"{regressor} takes no setting(s) {unknown}")
        return cls(**settings).fit(rows)

    def predict_ms(self, model: Any, rows: Any, catalog: Mapping[str, HardwareSpec]) -> tuple[np.ndarray, np.ndarray]:
        predicted = np.asarray(model.predict(rows).iter_time_ms, dtype=np.float64)
        return predicted, np.isfinite(predicted) & (predicted > 0)

    def domain(self, rows: Any) -> dict[str, Any]:
        from perfmodel.registry.registry import training_domain

        return {**training_domain(rows), "families": sorted({s.family for s in rows})}

    def seen_groups(self, domain: Mapping[str, Any]) -> set[str] | None:
        families = domain.get("families")
        return None if families is None else set(families)


class WholeStepRecipe(RoleRecipe):
    """`whole-step`: the learned whole-step stage on every stored whole-job run (`perfmodel import lambda`), held
    out by model family. Each run is composed once through the serving path with the promoted device model and no
    stage (`perfmodel.evaluation.real_runs.composed_frame`); the stage learns log(measured / composed) of one-GPU
    runs. Multi-GPU runs are left to the placement model (and judged in the GPU accuracy report)."""

    role = "whole-step"
    default_regressor = "device-whole-step"
    group_by = "family"

    def __init__(self, models_dir: Path | None = None):
        self.models_dir = models_dir

    @classmethod
    def regressors(cls) -> tuple[str, ...]:
        from perfmodel.evaluation.real_runs import STAGES

        return tuple(STAGES)

    def load(self, store: JobStore, catalog: Mapping[str, HardwareSpec], progress: Progress) -> RoleData:
        from perfmodel.evaluation.real_runs import composed_frame, steady_steps, stored_runs
        from perfmodel.predictor.placed import PlacementPredictor

        runs = [r for r in stored_runs(store) if r.devices == 1]
        if not runs:
            return RoleData(rows=pd.DataFrame(), groups=np.array([], dtype=object), measured_ms=np.array([]),
                            keys=[])
        predictor = PlacementPredictor.load(self.models_dir)
        frame = composed_frame(runs, predictor, progress=progress)
        steady, left_out = steady_steps(frame)
        for note in left_out:
            progress(f"whole-step: {note}")
        frame = frame[steady].reset_index(drop=True)
        return RoleData(rows=frame, groups=frame["family"].to_numpy(dtype=object),
                        measured_ms=frame["measured_ms"].to_numpy(dtype=np.float64), keys=list(frame["key"]),
                        notes={"one_gpu_configurations": int(len(frame)),
                               "accelerators": int(frame["accelerator"].nunique())})

    def subset(self, data: RoleData, mask: np.ndarray) -> Any:
        return data.rows[mask].reset_index(drop=True)

    def fit(self, regressor: str, settings: Mapping[str, Any], rows: Any, catalog: Mapping[str, HardwareSpec]) -> Any:
        from perfmodel.evaluation.real_runs import STAGES, fit_stage

        if regressor not in STAGES:
            raise PerfmodelError(f"role whole-step learns with one of {', '.join(STAGES)}, not {regressor!r}")
        settings = {k: v for k, v in settings.items() if k != "feature_names"}
        return fit_stage(rows, None, regressor, **settings)

    def predict_ms(self, model: Any, rows: Any, catalog: Mapping[str, HardwareSpec]) -> tuple[np.ndarray, np.ndarray]:
        from perfmodel.evaluation.real_runs import with_jobs

        out = model.predict(with_jobs(rows))  # rows composed by `load`: every composition feature is there
        factor = np.maximum(np.exp(out.log_factor), rows["roofline_over_composed"].to_numpy())
        return rows["single_ms"].to_numpy() * factor, np.ones(len(rows), dtype=bool)

    def domain(self, rows: Any) -> dict[str, Any]:
        return {"families": sorted(set(rows["family"])), "devices": sorted(set(rows["accelerator"])),
                "precisions": sorted(set(rows["precision"]))}

    def seen_groups(self, domain: Mapping[str, Any]) -> set[str] | None:
        families = domain.get("families")
        return None if families is None else set(families)


RECIPES: dict[str, type[RoleRecipe]] = {"cpu-step": IterationRecipe, "device-ops": DeviceOpsRecipe,
                                         "whole-step": WholeStepRecipe}


# --- the run ---------------------------------------------------------------------------------------------------------


@dataclass
class RoleOutcome:
    """What happened to one role (the report's `roles[]` entries)."""

    role: str
    decision: Decision
    reason: str
    data_hash: str | None = None
    rows: int = 0
    group_by: str | None = None
    held_out_groups: list[str] = field(default_factory=list)
    train_rows: int = 0
    held_out_rows: int = 0
    compared_rows: int = 0
    compared_groups: int = 0
    regressor: str | None = None
    champion: str | None = None
    champion_mape_pct: float | None = None
    champion_trained_on_held_out: bool | None = None
    challenger_mape_pct: float | None = None
    challenger_median_ape_pct: float | None = None
    champion_median_ape_pct: float | None = None
    required_mape_pct: float | None = None
    promoted: str | None = None
    per_group: dict[str, dict[str, Any]] = field(default_factory=dict)  # held-out group -> rows and MAPEs
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class RetrainResult:
    started_at: str
    finished_at: str
    store: str
    models_dir: str
    settings: dict[str, Any]
    roles: list[RoleOutcome]
    observations: dict[str, Any]
    error: str | None = None

    @property
    def exit_code(self) -> int:
        if self.error is not None or any(r.decision == "failed" for r in self.roles):
            return EXIT_FAILED
        return EXIT_PROMOTED if any(r.decision == "promoted" for r in self.roles) else EXIT_KEPT

    @property
    def status(self) -> str:
        return {EXIT_PROMOTED: "promoted", EXIT_KEPT: "kept", EXIT_FAILED: "failed"}[self.exit_code]

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "exit_code": self.exit_code, **asdict(self)}


def held_out_groups(groups: Sequence[str], fraction: float, seed: int,
                    seen: Collection[str] = ()) -> list[str]:
    """The groups held out: sorted by a seeded hash of their name, the first `fraction` of them (at least one,
    never all), groups not in `seen` (those the champion was trained on) first, so that the comparison is fair
    whenever new groups exist. Deterministic: the same groups, seed and `seen` give the same split."""
    unique = sorted(set(groups))
    if len(unique) < 2:
        raise PerfmodelError(f"need rows of at least 2 groups for a held-out split, got {len(unique)}: {unique}")
    ranked = sorted(unique, key=lambda g: (g in seen, hashlib.sha256(f"{seed}:{g}".encode()).hexdigest()))
    count = min(max(1, round(len(unique) * fraction)), len(unique) - 1)
    return sorted(ranked[:count])


def _mape(predicted: np.ndarray, measured: np.ndarray, groups: np.ndarray) -> tuple[float, float, dict[str, float]]:
    """(MAPE averaged over the groups, each held-out chip/family counting once; median APE over the rows;
    MAPE per group), in %."""
    ape = np.abs(predicted - measured) / measured * 100
    per_group = {str(g): float(ape[groups == g].mean()) for g in sorted(set(groups))}
    return float(np.mean(list(per_group.values()))), float(np.median(ape)), per_group


@contextmanager
def run_lock(models_dir: Path) -> Iterator[None]:
    """An exclusive, non-blocking lock on `<models_dir>/.retrain.lock` (released by the OS if the process dies).
    The folder must exist: a run never creates a registry."""
    if not models_dir.is_dir():
        raise PerfmodelError(f"the model registry {models_dir} does not exist")
    with open(models_dir / LOCK_FILE, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RetrainLockedError(f"another retrain is running (lock {models_dir / LOCK_FILE} is held)") from None
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_state(models_dir: Path) -> dict[str, Any]:
    path = models_dir / STATE_FILE
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return {}  # a damaged state file only costs one re-evaluation


def _save_version(registry: ModelRegistry, name: str, model: Any, domain: dict[str, Any], training_hash: str,
                  metrics: dict[str, Any]) -> str:
    """Write `model` as the next version of `name`: into a temporary folder beside it, then renamed into place, so
    a crash never leaves a partial version. Its manifest carries the retrain data hash and held-out metrics."""
    target = registry.next_version_dir(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = new_folder(target.parent, _TMP_PREFIX)  # readable as the shipped versions are (mkdtemp's are 0700)
    try:
        model.save(tmp)
        (tmp / DOMAIN_FILE).write_text(json.dumps(domain, indent=2, sort_keys=True) + "\n")
        manifest = Manifest.read(tmp)
        manifest.model_copy(update={"training_data_hash": training_hash,
                                    "metrics": {**manifest.metrics, "retrain": metrics}}).write(tmp)
        os.rename(tmp, target)  # atomic; fails if a concurrent writer took the version
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return f"{name}/{target.name}"


def _clean_stale_tmp(models_dir: Path) -> None:
    """Remove temporary folders a crashed run left (under the lock, so none is in use)."""
    for path in models_dir.glob(f"*/{_TMP_PREFIX}*"):
        shutil.rmtree(path, ignore_errors=True)


def _write_gpu_report(store: JobStore, root: Path, folder: Path, result: RetrainResult, say: Progress) -> None:
    """The GPU accuracy report of the store's whole-job runs, with the models now promoted (its path goes into
    the result's settings as `gpu_report`)."""
    from perfmodel.evaluation.gpu_report import gpu_accuracy, write_gpu_report
    from perfmodel.evaluation.real_runs import stored_runs

    runs = stored_runs(store)
    if not runs:
        say("gpu report: the store holds no whole-job runs (perfmodel import lambda DIR)")
        return
    say(f"gpu report: composing {len(runs)} configurations")
    paths = write_gpu_report(gpu_accuracy(models_dir=root, runs=runs, progress=say), folder)
    result.settings["gpu_report"] = str(paths["report"])


def observation_summary(store: JobStore) -> dict[str, Any]:
    """Per accelerator: observations posted to the service and the MAPE of the throughput predicted for them."""
    observations = store.observations()
    by_accelerator: dict[str, list[Any]] = {}
    for o in observations:
        by_accelerator.setdefault(o.accelerator, []).append(o)
    summary = {}
    for accelerator, rows in sorted(by_accelerator.items()):
        measured = np.array([o.throughput_samples_per_s for o in rows])
        predicted = np.array([o.predicted_throughput_samples_per_s for o in rows])
        summary[accelerator] = {"observations": len(rows),
                                "served_mape_pct": float(np.mean(np.abs(predicted - measured) / measured * 100)),
                                "model_versions": sorted({o.model_version for o in rows})}
    return {"count": len(observations), "by_accelerator": summary,
            "used_for": "report only (whole-placement throughputs; the service's calibration uses them online)"}


def _evaluate_role(recipe: RoleRecipe, store: JobStore, registry: ModelRegistry, settings: RetrainSettings,
                   catalog: Mapping[str, HardwareSpec], state: dict[str, Any], progress: Progress) -> RoleOutcome:
    from perfmodel.engine.models import promoted_by_store
    from perfmodel.registry.registry import read_domain
    from perfmodel.regressors import load_regressor

    role = recipe.role
    outcome = RoleOutcome(role=role, decision="kept", reason="", group_by=recipe.group_by)
    champion_ref = promoted_by_store(registry, store).get(role)
    champion_entry = registry.get(champion_ref) if champion_ref else None
    regressor = settings.regressors.get(role) or (champion_entry.manifest.regressor if champion_entry
                                                  else recipe.default_regressor)
    estimator = dict(champion_entry.manifest.settings) if champion_entry and \
        champion_entry.manifest.regressor == regressor else {}
    estimator.update(settings.estimator_settings.get(role, {}))
    if regressor == "roofline":  # learns nothing, takes no settings
        estimator = {}
    elif "seed" in inspect.signature(_regressor_class(regressor)).parameters:  # deterministic ones take none
        estimator.setdefault("seed", settings.seed)
    outcome.regressor, outcome.champion = regressor, champion_ref

    progress(f"{role}: reading the store")
    data = recipe.load(store, catalog, progress)
    outcome.rows, outcome.data = len(data), data.notes
    if len(data) == 0:
        outcome.reason = "no training data in the store"
        return outcome
    recipe_id = json.dumps({"regressor": regressor, "settings": settings.estimator_settings.get(role, {})},
                           sort_keys=True, default=str)  # the data and what was asked, not the inherited settings
    outcome.data_hash = data_hash([*data.keys, f"recipe={recipe_id}"])
    last = state.get(role, {})
    if not settings.force:
        if champion_entry is not None and champion_entry.manifest.training_data_hash == outcome.data_hash:
            outcome.reason = f"no new data: the promoted {champion_ref} was trained on exactly this data"
            return outcome
        if last.get("data_hash") == outcome.data_hash and last.get("champion") == champion_ref:
            outcome.reason = (f"no new data since the last run ({last.get('finished_at')}: "
                              f"{last.get('decision')}, {last.get('reason')})")
            return outcome

    champion_domain = read_domain(champion_entry.path) if champion_entry is not None else {}
    seen = recipe.seen_groups(champion_domain) or set()
    held = held_out_groups(list(data.groups), settings.holdout_fraction, settings.seed, seen)
    test = np.isin(data.groups, held)
    outcome.held_out_groups, outcome.train_rows, outcome.held_out_rows = held, int((~test).sum()), int(test.sum())
    train_rows, test_rows = recipe.subset(data, ~test), recipe.subset(data, test)
    measured = data.measured_ms[test]
    progress(f"{role}: fitting the challenger ({regressor}) on {outcome.train_rows} rows, holding out "
             f"{recipe.group_by} {', '.join(held)} ({outcome.held_out_rows} rows)")
    challenger = recipe.fit(regressor, estimator, train_rows, catalog)
    challenger_ms, challenger_ok = recipe.predict_ms(challenger, test_rows, catalog)

    champion_ms, champion_ok = None, np.ones(len(measured), dtype=bool)
    if champion_entry is not None:
        champion = load_regressor(champion_entry.path)
        champion_ms, champion_ok = recipe.predict_ms(champion, test_rows, catalog)
        outcome.champion_trained_on_held_out = recipe.champion_saw(champion_domain, held)
    common = challenger_ok & champion_ok
    outcome.compared_rows = int(common.sum())
    if not common.any():
        raise PerfmodelError(f"{role}: no held-out row that both the challenger and the champion can predict")
    held_groups = data.groups[test][common]
    outcome.compared_groups = len(set(held_groups))
    outcome.challenger_mape_pct, outcome.challenger_median_ape_pct, challenger_by_group = _mape(
        challenger_ms[common], measured[common], held_groups)
    outcome.per_group = {g: {"rows": int((held_groups == g).sum()), "challenger_mape_pct": m}
                         for g, m in challenger_by_group.items()}
    metrics = {"held_out_groups": held, "group_by": recipe.group_by, "compared_rows": outcome.compared_rows,
               "mape_pct": outcome.challenger_mape_pct, "median_ape_pct": outcome.challenger_median_ape_pct}
    if champion_ms is None:
        outcome.reason = "no promoted model for this role: the first candidate is promoted"
    else:
        outcome.champion_mape_pct, outcome.champion_median_ape_pct, champion_by_group = _mape(
            champion_ms[common], measured[common], held_groups)
        for g, m in champion_by_group.items():
            outcome.per_group[g]["champion_mape_pct"] = m
        outcome.required_mape_pct = outcome.champion_mape_pct * (1 - settings.min_improvement_pct / 100)
        metrics.update(champion=champion_ref, champion_mape_pct=outcome.champion_mape_pct)
        if (outcome.compared_rows < settings.min_compared_rows
                or outcome.compared_groups < settings.min_compared_groups):
            outcome.reason = (
                f"champion {champion_ref} kept: too little held-out evidence to replace it, "
                f"{outcome.compared_rows} rows of {outcome.compared_groups} "
                f"{_plural(recipe.group_by, outcome.compared_groups)} compared (needs at least "
                f"{settings.min_compared_rows} rows of {settings.min_compared_groups} "
                f"{_plural(recipe.group_by, settings.min_compared_groups)}; held-out "
                f"MAPE {outcome.champion_mape_pct:.2f} % vs challenger {outcome.challenger_mape_pct:.2f} %): "
                f"more data, or a larger --holdout-fraction")
            return outcome
        if not outcome.challenger_mape_pct < outcome.required_mape_pct:
            outcome.reason = (f"champion {champion_ref} kept: held-out MAPE {outcome.champion_mape_pct:.2f} % vs "
                              f"challenger {outcome.challenger_mape_pct:.2f} % (needs < "
                              f"{outcome.required_mape_pct:.2f} %, {settings.min_improvement_pct:g} % better)")
            return outcome
        outcome.reason = (f"challenger better: held-out MAPE {outcome.challenger_mape_pct:.2f} % vs champion "
                          f"{champion_ref} {outcome.champion_mape_pct:.2f} %")

    progress(f"{role}: refitting the challenger on all {len(data)} rows")
    final = recipe.fit(regressor, estimator, data.rows, catalog)
    name = champion_entry.name if champion_entry is not None and champion_entry.manifest.regressor == regressor \
        else regressor
    ref = _save_version(registry, name, final, recipe.domain(data.rows), outcome.data_hash, metrics)
    # as `perfmodel models promote` and the service do: a `promoted` event in the store, then promoted.json
    registry.promote(ref, role=role, store=store, by={"by": "retrain", "data_hash": outcome.data_hash},
                     previous=champion_ref)
    outcome.decision, outcome.promoted = "promoted", ref
    return outcome


def _plural(noun: str, count: int) -> str:
    """`noun` (a group kind: family, chip) for `count` of them."""
    if count == 1:
        return noun
    return noun[:-1] + "ies" if noun.endswith("y") else noun + "s"


def retrain(store_url: str | None = None, models_dir: Path | None = None, settings: RetrainSettings | None = None,
            *, progress: Progress | None = None, graph_cache_dir: Path | None = None) -> RetrainResult:
    """One retraining run over every role of `settings` (see the module doc). Never raises for a failed role or an
    unreadable store: the result says `failed` (exit code 1) with the error."""
    from perfmodel.registry.registry import default_models_dir
    from perfmodel.settings import Settings
    from perfmodel.store.schema import safe_url

    settings = settings or RetrainSettings()
    say = progress or (lambda message: None)
    root = Path(models_dir) if models_dir is not None else default_models_dir()
    url = store_url or Settings().resolved_store_url()
    started = datetime.now(timezone.utc).isoformat()
    result = RetrainResult(started_at=started, finished_at=started, store=safe_url(url), models_dir=str(root),
                           settings={**asdict(settings), "roles": list(settings.roles),
                                     "gpu_report_dir": None if settings.gpu_report_dir is None
                                     else str(settings.gpu_report_dir)},
                           roles=[], observations={})
    try:
        with run_lock(root):
            _clean_stale_tmp(root)
            _run(result, url, root, settings, say, graph_cache_dir)
    except PerfmodelError as exc:
        result.error = str(exc)
    result.finished_at = datetime.now(timezone.utc).isoformat()
    return result


def _run(result: RetrainResult, url: str, root: Path, settings: RetrainSettings, say: Progress,
         graph_cache_dir: Path | None) -> None:
    from sqlalchemy.exc import SQLAlchemyError

    from perfmodel.engine.models import promoted_by_store
    from perfmodel.hardware.catalog import load_catalog
    from perfmodel.store.jobs import JobStore

    registry = ModelRegistry(root)
    state = _read_state(root)
    catalog = load_catalog()
    try:
        store = JobStore(url)
    except SQLAlchemyError as exc:
        raise PerfmodelError(f"cannot open the store: {exc}") from None
    with store:
        try:
            result.observations = observation_summary(store)
        except SQLAlchemyError as exc:
            raise PerfmodelError(f"cannot read the store: {exc}") from None
        for role in settings.roles:
            recipe = (IterationRecipe(graph_cache_dir) if role == "cpu-step" else
                      WholeStepRecipe(root) if role == "whole-step" else RECIPES[role]())
            started = time.perf_counter()
            try:
                outcome = _evaluate_role(recipe, store, registry, settings, catalog, state, say)
            except (PerfmodelError, SQLAlchemyError, OSError, ValueError) as exc:
                outcome = RoleOutcome(role=role, decision="failed", reason=f"{type(exc).__name__}: {exc}")
            outcome.seconds = round(time.perf_counter() - started, 3)
            say(f"{role}: {outcome.decision}: {outcome.reason}")
            result.roles.append(outcome)
            if outcome.decision != "failed" and outcome.data_hash is not None:
                state[role] = {"data_hash": outcome.data_hash, "decision": outcome.decision,
                               "reason": outcome.reason, "champion": promoted_by_store(registry, store).get(role),
                               "finished_at": datetime.now(timezone.utc).isoformat()}
        write_json_atomically(root / STATE_FILE, state)
        if settings.gpu_report_dir is not None and "whole-step" in settings.roles:
            _write_gpu_report(store, root, settings.gpu_report_dir, result, say)

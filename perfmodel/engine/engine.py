"""`PredictionEngine`: what the service (every worker) and `perfmodel predict` answer with. It owns

- jobs and graphs: registered jobs come from the store (their graph IR is stored with them: no capture after a
  restart); graphs are captured once per spec, one capture at a time, concurrent requests for one spec waiting on
  one capture (`GraphCache`); jobs, graphs and the placement predictor's per-device computes are bounded LRUs;
- calibration (`perfmodel.calibration`): a job's observations against the serving model, and the fleet's (every
  observed job's, `perfmodel.calibration.fleet`) for jobs that did not observe the accelerator they are asked about;
  recomputed off the caller's thread whenever the model or any observation changes; observations are checked against
  physics first;
- the model lifecycle (`ModelLifecycle`): pin, promote, sync, with promotion state in the store.

Two paths. `predict_cached` is dictionary look-ups plus the placement model's arithmetic and returns None when
anything is missing (a job not in memory, a compute not cached, a calibration to recompute): it may run on an
event loop. Every other public method may block (store, capture, per-op model, model loading): the service runs
them in a worker thread.

Errors are `perfmodel.engine.errors` (`FieldError`, `NotFound`, `Refused`) and other `PerfmodelError`s; a bug
raises what it raises.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from perfmodel.calibration import (
    Calibration,
    ObservationRefused,
    ObservedPoint,
    calibrate,
    ceiling_samples_per_s,
    check_observation,
    leave_one_out,
    recency_weights,
)
from perfmodel.calibration.fleet import Applied, FleetCalibration, FleetPoint, FleetPriors, FleetQuery, fit_fleet
from perfmodel.calibration.sharing import (
    SharedPoint,
    SharingApplied,
    SharingCalibration,
    calibrate_sharing,
    reported_band,
    share_calibrated,
)
from perfmodel.core.accuracy import Z80
from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph
from perfmodel.core.lru import LRU
from perfmodel.engine.errors import FieldError, Loc, NotFound, Refused
from perfmodel.engine.graphs import GraphCache, batch_free_key
from perfmodel.engine.models import LOAD_ERRORS, ModelEvents, ModelLifecycle
from perfmodel.hardware.custom import LiveCatalog
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import GraphSource, JobSpec, ZooSource
from perfmodel.placement.colocation import ColocationParams, Sharing, SharingJob
from perfmodel.placement.spec import PlacementSpec, data_parallel
from perfmodel.predictor.memory import shared_capacity_bytes
from perfmodel.predictor.predict import HOST_BOUND_RATIO, Prediction, device_time_ms, prediction_json
from perfmodel.records import utc_now

if TYPE_CHECKING:  # for annotations only: the engine is handed its store and limits
    from perfmodel.jobs.limits import JobLimits
    from perfmodel.store.jobs import JobRecord, ObservationRecord

log = logging.getLogger("perfmodel.engine")

RECENT_OBSERVATIONS = 20
PLACEMENT_CACHE_SIZE = 4096
NO_CALIBRATION = Calibration()
NO_FLEET = FleetCalibration()
SYNC_KEYS_PER_QUERY = 500
FLEET_RETRY_S = 1.0  # while the store does not answer, the fleet is refitted at most this often
_FIELD_PREFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*): ")  # "batch_size: 3 is over ..."


@dataclass(frozen=True)
class EngineConfig:
    """What an engine is built with: the model registry, an optional pin, and the bounds of its caches."""

    models_dir: Path | None = None
    model_version: str | None = None  # NAME/VERSION pinned for its role (survives promotions and sync)
    max_cached_jobs: int = 20_000  # jobs, and graphs, kept in memory
    max_cached_computes: int = 20_000  # per-device computes, memory estimates, links of the placement predictor
    capture_timeout_s: float | None = None  # None: `graphs.DEFAULT_CAPTURE_TIMEOUT_S`
    capture_limits: JobLimits | None = None  # None: its defaults
    isolate_captures: bool = True  # capture in a time-limited child process (False: the CLI, in-process)
    graph_dir: Path | None = None  # keep captured zoo and HF-config graphs here across processes (the CLI)
    fleet_priors: FleetPriors = field(default_factory=FleetPriors)  # the fleet's priors (`fleet_priors_from`)

    @classmethod
    def from_settings(cls, settings: object) -> EngineConfig:
        """From the service's settings (fields it lacks keep their defaults)."""
        names = {"models_dir": "models_dir", "model_version": "model_version", "max_cached_jobs": "max_cached_jobs",
                 "max_cached_computes": "max_cached_computes", "capture_timeout_s": "capture_timeout_s",
                 "capture_limits": "job_limits"}
        return cls(**{name: getattr(settings, source) for name, source in names.items()
                      if getattr(settings, source, None) is not None}, fleet_priors=fleet_priors_from(settings))

    def graph_cache(self) -> GraphCache:
        return GraphCache(self.max_cached_jobs, deadline_s=self.capture_timeout_s, limits=self.capture_limits,
                          isolated=self.isolate_captures, directory=self.graph_dir)


def fleet_priors_from(settings: object) -> FleetPriors:
    """The fleet's priors with the job's and the chip's standard deviations from `settings` (`fleet_job_prior`,
    `fleet_chip_prior`; fields it lacks keep the defaults)."""
    given = {name: getattr(settings, f"fleet_{name}_prior", None) for name in ("job", "chip")}
    return replace(FleetPriors(), **{name: float(value) for name, value in given.items() if value is not None})


class Placements(Protocol):
    """What the engine asks of the prediction model (`perfmodel.predictor.placed.PlacementPredictor`): it is
    handed each job's graph and prices placements; it never captures a graph (micro-batches other than the job's
    come from the engine's `GraphCache`, its graph source)."""

    @property
    def model_versions(self) -> dict[str, str]: ...

    def predict(self, spec: JobSpec, placement: PlacementSpec, *, graph: Graph | None = None) -> Prediction: ...

    def matrix_arrays(self, specs: Sequence[JobSpec], placements: Sequence[PlacementSpec], *,
                      graphs: Sequence[Graph | None] | None = None) -> dict[str, Any]: ...

    def predict_matrix(self, specs: Sequence[JobSpec], placements: Sequence[PlacementSpec], *,
                       graphs: Sequence[Graph | None] | None = None) -> list[list[Prediction]]: ...

    def cached_fields(self, spec: JobSpec, placement: PlacementSpec) -> dict[str, Any] | None: ...

    def hardware(self, name: str) -> HardwareSpec: ...

    def prefetch(self, wanted: Sequence[tuple[JobSpec, HardwareSpec, int, Graph | None]]) -> None: ...

    def composition(self, spec: JobSpec, placement: PlacementSpec) -> dict[str, float] | None: ...

    def cache_sizes(self) -> dict[str, int]: ...

    def use_catalog(self, catalog: Mapping[str, Any]) -> None: ...


class Store(ModelEvents, Protocol):
    """What the engine asks of the job store (`perfmodel.store.jobs.JobStore`): its jobs and observations, and the
    model events its lifecycle reads and writes (`ModelEvents`)."""

    def get_job(self, key: str, *, with_graph: bool = False) -> JobRecord | None: ...

    def add_job(self, spec: JobSpec, graph_json: str | None = None) -> tuple[JobRecord, bool]: ...

    def jobs(self) -> list[JobRecord]: ...

    def job_ids(self) -> set[str]: ...

    def delete_job(self, key: str) -> bool: ...

    def add_observation(self, key: str, *, placement: dict[str, Any], accelerator: str, devices: int,
                        throughput_samples_per_s: float, predicted_throughput_samples_per_s: float,
                        model_version: str, colocated_with: str | None = None,
                        sharing: str | None = None) -> ObservationRecord: ...

    def observations(self, key: str | None = None, *, after_id: int = 0) -> list[ObservationRecord]: ...

    def observation(self, observation_id: int) -> ObservationRecord | None: ...

    def delete_observation(self, observation_id: int) -> ObservationRecord | None: ...

    def observation_ids(self, keys: Iterable[str]) -> dict[str, set[int]]: ...

    def observed_job_ids(self) -> list[str]: ...

    def last_observation_id(self) -> int: ...


class PlacementTemplate(Protocol):
    """A placement whose global batch may still depend on the job's batch (the service's `PlacementIn`)."""

    accelerator: str

    def to_spec(self, batch_size: int) -> PlacementSpec: ...


@dataclass(eq=False)
class JobEntry:
    """A job the engine holds: its spec and graph and, for a registered job, its observations and calibration."""

    key: str
    spec: JobSpec
    graph: Graph
    registered: bool
    created_at: datetime | None = None
    observations: list[ObservationRecord] = field(default_factory=list)  # oldest first
    revision: int = 0  # bumped whenever `observations` changes
    calibration: Calibration = NO_CALIBRATION
    calibrated_at: tuple[int, int] = (-1, -1)  # (model generation, revision) `calibration` was computed for
    fleet_points: tuple[FleetPoint, ...] = ()  # its observations as the fleet sees them (with `calibration`)
    sharing: SharingCalibration = field(default_factory=SharingCalibration)  # its reports while sharing its GPUs
    sharing_at: tuple[int, int, int] = (-1, -1, -1)  # (model generation, revision, fleet revision) of `sharing`

    @property
    def alone(self) -> list[ObservationRecord]:
        """Its observations alone on their placement (what calibrates its isolated answers)."""
        return [o for o in self.observations if o.colocated_with is None]

    @property
    def shared(self) -> list[ObservationRecord]:
        """Its observations while sharing its GPUs with another job (what calibrates its co-located answers)."""
        return [o for o in self.observations if o.colocated_with is not None]

    @functools.cached_property
    def model_key(self) -> str:
        """The job whatever its batch: what the fleet's job effect is keyed by (a model's error barely depends on
        the batch it runs, and schedulers ask for batches never observed)."""
        return batch_free_key(self.spec)


@dataclass(unsafe_hash=True)  # hashable: engine.placement caches by it
class SamePlacement:
    """A placement's devices and parallelism for any job, each at its own batch per replica: how a report of one
    job while sharing places the other."""

    spec: PlacementSpec
    accelerator: str = ""

    def __post_init__(self) -> None:
        self.accelerator = self.spec.accelerator

    def to_spec(self, batch_size: int) -> PlacementSpec:
        parallelism = self.spec.parallelism
        return PlacementSpec.model_validate({**self.spec.model_dump(mode="json"), "global_batch_size":
                                             batch_size * parallelism.data * parallelism.micro_batches})


@dataclass(frozen=True)
class SharedPair:
    """Two jobs on the same placement (`PredictionEngine._pair`): each one's isolated answer and step as the
    co-location model sees it, and its step while sharing (calibrated by `applied`)."""

    answers: list[dict[str, Any]]
    jobs: list[SharingJob]
    placements: list[PlacementSpec]
    steps_ms: list[float]
    applied: tuple[SharingApplied, SharingApplied]
    device_share: list[float]
    memory: list[int]
    capacity: int | None
    params: ColocationParams  # the co-location constants of the placement's GPU class


def ir_batch(graph: Graph) -> int | None:
    """The batch an IR was captured at: as it records it, else the leading dimension its inputs share (None if
    they do not: a time-major model's inputs lead with the sequence)."""
    if graph.batch_size is not None:
        return graph.batch_size
    leading = {meta.shape[0] for meta in graph.inputs if meta.shape}
    return leading.pop() if len(leading) == 1 else None


@contextlib.contextmanager
def _model_refusals_at(where: Loc) -> Iterator[None]:
    """The model's refusals of a placement (PerfmodelError) as a FieldError at `where`; FieldErrors pass."""
    try:
        yield
    except FieldError:
        raise
    except PerfmodelError as exc:
        raise FieldError(where, str(exc).removeprefix("placement.")) from None


class PredictionEngine:
    def __init__(self, config: EngineConfig, predictor: Placements, lifecycle: ModelLifecycle,
                 store: Store | None = None,
                 *, graphs: GraphCache | None = None, catalog: Mapping[str, HardwareSpec] | None = None):
        """Cheap: `open` loads the models and reads the store."""
        self.config = config
        self.store = store
        self.predictor = predictor  # replaced whole (one reference assignment) on promotion
        self.generation = 0  # bumped with every new predictor: calibrations are recomputed
        self.lifecycle = lifecycle
        self.graphs = graphs if graphs is not None else config.graph_cache()
        self._catalog = catalog
        self._jobs: LRU[str, JobEntry] = LRU(config.max_cached_jobs)
        self._placements: LRU[tuple[Any, int], PlacementSpec] = LRU(PLACEMENT_CACHE_SIZE)
        self._hardware: LRU[str, HardwareSpec] = LRU(PLACEMENT_CACHE_SIZE)  # accelerator names and aliases as given
        self._lock = threading.Lock()  # observation lists of entries
        self._promote_lock = threading.Lock()
        self._last_observation_id = 0
        self._listeners: list[Callable[[dict[str, str]], None]] = []
        self.fleet_revision = 0  # bumped whenever any job's observations change
        self._fleet = NO_FLEET
        self._fleet_at: tuple[int, int] = (-1, -1)  # (model generation, fleet revision) `_fleet` was fitted for
        self._fleet_retry_at = 0.0  # time.monotonic() before which a refit that found the store down is not retried
        self._steps_seen: tuple[Any, ...] | None = None  # `device_steps.signature()` the fleet last read

    # --- opening ------------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, config: EngineConfig, store: Store | None = None) -> PredictionEngine:
        """An engine serving the models the store (else the registry) promotes, the pin replacing its role's.
        Blocking; raises if a model does not load."""
        from perfmodel.registry.registry import ModelRegistry

        registry = ModelRegistry(config.models_dir)
        pin = ModelLifecycle.resolve_pin(registry, config.model_version)
        graphs = config.graph_cache()
        catalog = live_catalog(store)  # read now, not on the first request (which may run on an event loop)
        lifecycle = ModelLifecycle(registry, store, pin,
                                   lambda refs: load_placement_predictor(config, graphs, catalog, refs))
        engine = cls(config, lifecycle.load_wanted(), lifecycle, store, graphs=graphs, catalog=catalog)
        if store is not None:
            engine._last_observation_id = store.last_observation_id()
        engine.fleet()  # fitted now, and again after every change, so that requests find it current
        return engine

    def _load_predictor(self, refs: dict[str, str | None]) -> Placements:
        return load_placement_predictor(self.config, self.graphs, self.catalog, refs)

    @property
    def catalog(self) -> Mapping[str, HardwareSpec]:
        """The accelerators predictions resolve: shipped + local entries and the store's custom ones
        (`perfmodel.hardware.custom.LiveCatalog`, refreshed by `sync_once`)."""
        if self._catalog is None:
            self._catalog = live_catalog(self.store)
        return self._catalog

    @property
    def model_versions(self) -> dict[str, str]:
        return self.predictor.model_versions

    def subscribe(self, listener: Callable[[dict[str, str]], None]) -> None:
        """`listener(model_versions)` is called after every change of the serving models."""
        self._listeners.append(listener)

    def jobs_cached(self) -> int:
        """Jobs held in memory (at most `max_cached_jobs`)."""
        return len(self._jobs)

    def stats(self) -> dict[str, int]:
        """Entries held by each cache (each bounded)."""
        return {"jobs": len(self._jobs), "graphs": len(self.graphs), "placements": len(self._placements),
                "captures": self.graphs.captures, "synthesized_graphs": self.graphs.synthesized,
                **{f"predictor_{name}": size for name, size in self.predictor.cache_sizes().items()}}

    # --- jobs ---------------------------------------------------------------------------------------------------

    def job_cached(self, ref: str | JobSpec) -> JobEntry | None:
        """The job an id or a spec names, if in memory (a job id only once registered). Cheap."""
        if isinstance(ref, str):
            entry = self._jobs.get(ref)
            return entry if entry is not None and entry.registered else None
        return self._jobs.get(ref.key())

    def job(self, ref: str | JobSpec, where: Loc = ("job",)) -> JobEntry:
        """A registered job by id (from the store: NotFound if there is none), or a spec given inline (its graph
        captured once and kept in memory; not registered). Blocking."""
        cached = self.job_cached(ref)
        if cached is not None:
            return cached
        if isinstance(ref, str):
            return self._load(ref)
        graph = self._graph_of(ref, where)
        self._check_ir(ref, graph, where)
        return self._jobs.setdefault(ref.key(), JobEntry(key=ref.key(), spec=ref, graph=graph, registered=False))

    def _graph_of(self, spec: JobSpec, where: Loc) -> Graph:
        """The spec's graph; what the client got wrong is a FieldError at `where` (the job), extended by the field
        its message names first (a limit on `batch_size`, `source.config.n_layer`, ...), else at `source`."""
        try:
            return self.graphs.graph(spec)
        except FieldError:
            raise
        except PerfmodelError as exc:
            message = " ".join(str(exc).split())
            named = _FIELD_PREFIX.match(message)
            if named is None:
                raise FieldError((*where, "source"), message) from None
            parts = tuple(int(p) if p.isdigit() else p for p in named.group(1).split("."))
            raise FieldError((*where, *parts), message[named.end():]) from None

    def _load(self, key: str) -> JobEntry:
        assert self.store is not None, "an engine without a store has no registered jobs"
        record = self.store.get_job(key, with_graph=True)
        if record is None:
            raise NotFound(f"no job {key!r}: register it with POST /v1/jobs")
        if record.graph_json:
            graph = self.graphs.put(record.spec, Graph.from_json(record.graph_json))
        else:
            graph = self._graph_of(record.spec, ())
        entry = JobEntry(key=key, spec=record.spec, graph=graph, registered=True, created_at=record.created_at,
                         observations=self.store.observations(key))
        known = self._jobs.peek(key)
        if known is not None and known.registered:
            return known  # another thread got there first
        return self._jobs.put(key, entry)

    @staticmethod
    def _check_ir(spec: JobSpec, graph: Graph, where: Loc) -> None:
        """An IR's inputs carry the batch it was captured at: a spec that says another batch is refused."""
        if not isinstance(spec.source, GraphSource):
            return
        captured = ir_batch(graph)
        if captured is not None and captured != spec.batch_size:
            raise FieldError((*where, "batch_size"), (
                f"batch_size {spec.batch_size} does not match the graph IR, captured at batch {captured} (as the IR "
                f"records it, or else the leading dimension of its inputs): register it with batch_size {captured}, "
                f"or capture the IR at batch {spec.batch_size}"))

    def register(self, spec: JobSpec, graph: Graph | None = None) -> tuple[JobEntry, bool]:
        """Store the job (once: the same spec gets the same id) with its graph. Blocking."""
        assert self.store is not None, "an engine without a store registers nothing"
        key = spec.key()
        if graph is None:
            cached = self._jobs.peek(key)
            graph = cached.graph if cached is not None else self._graph_of(spec, ())
        self._check_ir(spec, graph, ())
        record, created = self.store.add_job(spec, graph.to_json())
        self._prepare_batches(spec, graph)
        known = self._jobs.peek(key)
        if known is not None and known.registered:
            return known, created
        entry = JobEntry(key=key, spec=spec, graph=graph, registered=True, created_at=record.created_at,
                         observations=[] if created else self.store.observations(key))
        return self._jobs.put(key, entry), created

    def _prepare_batches(self, spec: JobSpec, graph: Graph) -> None:
        """Capture a registered job at a second batch, so that a scheduler's batch sweeps cost no capture; a model
        that cannot (a limit on the doubled batch, a capture that fails) keeps capturing each batch asked."""
        try:
            self.graphs.prepare_batches(spec, graph)
        except PerfmodelError as exc:
            log.info("job %s: no graph at a second batch (%s); other batches will be captured", spec.name, exc)

    def delete_job(self, key: str) -> None:
        assert self.store is not None
        if not self.store.delete_job(key):
            raise NotFound(f"no job {key!r}")
        self._jobs.pop(key)
        self._fleet_changed()
        self.fleet()

    def jobs(self) -> list[JobEntry]:
        """Every registered job (loaded from the store where not in memory). Blocking."""
        assert self.store is not None
        return [self.job(record.key) for record in self.store.jobs()]

    # --- placements ---------------------------------------------------------------------------------------------

    def placement(self, given: PlacementTemplate | PlacementSpec, batch_size: int,
                  where: Loc = ("placement",)) -> PlacementSpec:
        """The full placement of `given` for a job of `batch_size` (cached); FieldError naming the field."""
        cache_key = (given, batch_size)
        spec = self._placements.get(cache_key)
        if spec is not None:
            return spec
        return self._placements.put(cache_key, self._resolve_placement(given, batch_size, where))

    def _resolve_placement(self, given: PlacementTemplate | PlacementSpec, batch_size: int,
                           where: Loc) -> PlacementSpec:
        """`placement` without its cache: a searching scheduler's bodies are new, and resolving one costs less
        than hashing it for a cache that would not hold it."""
        self.hardware(given.accelerator, (*where, "accelerator"))
        to_spec = getattr(given, "to_spec", None)
        try:
            resolved = to_spec(batch_size) if to_spec is not None else given
        except ValidationError as exc:
            raise FieldError.from_validation(exc, where) from None
        assert isinstance(resolved, PlacementSpec)
        return resolved

    def hardware(self, name: str, where: Loc = ("placement", "accelerator")) -> HardwareSpec:
        """The catalog entry a name or alias names (cached); FieldError at `where` if none."""
        found = self._hardware.get(name)
        if found is None:
            from perfmodel.hardware.catalog import get_accelerator

            try:
                found = self._hardware.put(name, get_accelerator(name, self.catalog))
            except PerfmodelError as exc:
                raise FieldError(where, str(exc)) from None
        return found

    @staticmethod
    def check_ir_batch(entry: JobEntry, placement: PlacementSpec, where: Loc = ("placement",)) -> None:
        """An IR job's graph holds the shapes of its batch: a placement with another micro-batch is refused."""
        if isinstance(entry.spec.source, GraphSource) and placement.micro_batch_size != entry.spec.batch_size:
            raise FieldError(where, (
                f"the job's graph IR was captured at batch {entry.spec.batch_size}; this placement runs micro-"
                f"batches of {placement.micro_batch_size} per device (set global_batch_size to "
                f"{entry.spec.batch_size} × parallelism.data × parallelism.micro_batches, or leave it out, or "
                f"register the IR of that batch)"))

    # --- predictions --------------------------------------------------------------------------------------------

    def predict_cached(self, ref: str | JobSpec, given: PlacementTemplate | PlacementSpec,
                       where: Loc = ("placement",)) -> dict[str, Any] | None:
        """The calibrated prediction if everything it needs is in memory, else None (then call `predict`).
        Dictionary look-ups and array arithmetic only: safe on an event loop."""
        entry = self.job_cached(ref)
        if entry is None:
            return None
        predictor = self.predictor
        calibration, fleet = self._current_calibration(entry), self._current_fleet()
        if calibration is None or fleet is None:
            return None
        placement = self._resolve_placement(given, entry.spec.batch_size, where)
        self.check_ir_batch(entry, placement, where)
        with _model_refusals_at(where):
            fields = predictor.cached_fields(entry.spec, placement)
        if fields is None:
            return None
        return self._respond_json(entry, prediction_json(fields), placement, calibration, fleet)

    def response_token(self, ref: str | JobSpec) -> tuple[str, int, int] | None:
        """What a cached prediction of a registered job depends on besides its placement: (job id, model
        generation, the fleet's observation revision), or None when the job or its calibration is not in memory.
        A response stored under this token stays right until the token changes. Cheap."""
        if not isinstance(ref, str):
            return None
        entry = self.job_cached(ref)
        if entry is None or self._current_calibration(entry) is None or self._current_fleet() is None:
            return None
        return entry.key, self.generation, self.fleet_revision

    def predict(self, ref: str | JobSpec, given: PlacementTemplate | PlacementSpec, *, job_where: Loc = ("job",),
                where: Loc = ("placement",)) -> dict[str, Any]:
        """The calibrated prediction of a job on a placement. Blocking (capture, store, per-op model)."""
        entry = self.job(ref, job_where)
        placement = self.placement(given, entry.spec.batch_size, where)
        self.check_ir_batch(entry, placement, where)
        prediction = self._raw(self.predictor, entry, placement, where)
        return self.respond(entry, prediction, self.calibration(entry), self.fleet())

    def prediction(self, spec: JobSpec, placement: PlacementSpec) -> Prediction:
        """The uncalibrated `Prediction` of a spec on a full placement (what `perfmodel predict` prints)."""
        entry = self.job(spec)
        return self._raw(self.predictor, entry, placement, ("placement",))

    @staticmethod
    def _raw(predictor: Placements, entry: JobEntry, placement: PlacementSpec, where: Loc) -> Prediction:
        with _model_refusals_at(where):
            return predictor.predict(entry.spec, placement, graph=entry.graph)

    def prefetch(self, groups: Sequence[tuple[Sequence[JobEntry], Sequence[PlacementSpec]]], where: Loc) -> None:
        """Compose every device step the (jobs, placements) groups need in one call of the per-op model, so that
        `raw_matrix` of each group is arithmetic (a matrix whose jobs differ in batch makes one group per batch)."""
        wanted = [(entry.spec, self.predictor.hardware(p.accelerator), p.micro_batch_size, entry.graph)
                  for entries, placements in groups for p in placements for entry in entries]
        with _model_refusals_at(where):
            self.predictor.prefetch(wanted)

    def raw_matrix(self, entries: Sequence[JobEntry], placements: Sequence[PlacementSpec],
                   where: Loc) -> dict[str, Any]:
        """`PlacementPredictor.matrix_arrays` of the jobs × placements, uncalibrated. Blocking."""
        with _model_refusals_at(where):
            return self.predictor.matrix_arrays([e.spec for e in entries], placements,
                                                graphs=[e.graph for e in entries])

    def raw_predictions(self, entries: Sequence[JobEntry], placements: Sequence[PlacementSpec],
                        where: Loc) -> list[list[Prediction]]:
        with _model_refusals_at(where):
            return self.predictor.predict_matrix([e.spec for e in entries], placements,
                                                 graphs=[e.graph for e in entries])

    def respond(self, entry: JobEntry, prediction: Prediction, calibration: Calibration | None = None,
                fleet: FleetCalibration | None = None) -> dict[str, Any]:
        """The predict response: the prediction, calibrated by what the job observed on the accelerator (and on
        that device count, where it differs), else by what the fleet observed (`applied`); `calibration` says
        which level applied, what is behind it and the factor."""
        return self._respond_json(entry, prediction.model_dump(mode="json"), prediction.placement, calibration,
                                  fleet)

    def _respond_json(self, entry: JobEntry, data: dict[str, Any], placement: PlacementSpec | None,
                      calibration: Calibration | None, fleet: FleetCalibration | None) -> dict[str, Any]:
        """`respond` of a prediction already in its JSON form (`Prediction.model_dump(mode="json")`, or
        `prediction_json`), completed in place."""
        iter_time_ms, throughput = data["iter_time_ms"], data["throughput_samples_per_s"]
        applied = self.applied(entry, data["accelerator"], data["devices"],
                               _communication_share(data["breakdown_ms"], iter_time_ms), calibration, fleet,
                               interval_ms=data["interval_ms"])
        if placement is not None:
            applied = self.within_physics(entry, placement, throughput, applied, calibration)
        factor = applied.throughput_factor
        data.update(job_id=entry.key, calibrated=applied.level != "none", calibration_factor=factor,
                    observations=applied.observations, calibration=applied.as_dict(),
                    uncalibrated_iter_time_ms=iter_time_ms, uncalibrated_throughput_samples_per_s=throughput)
        reason = self.host_bound(entry, calibration)
        data.update(host_bound_likely=reason is not None, host_bound_reason=reason)
        if applied.level != "none":
            calibrated_ms = iter_time_ms / factor
            data["throughput_samples_per_s"] = throughput * factor
            data["iter_time_ms"] = calibrated_ms
            data["interval_ms"] = [calibrated_ms * (bound / iter_time_ms) ** applied.interval_scale
                                   for bound in data["interval_ms"]]
            data["breakdown_ms"] = {k: v / factor for k, v in data["breakdown_ms"].items()}
            data["throughput_items_per_s"] = data["throughput_samples_per_s"] * data["items_per_sample"]
        return data

    def host_bound(self, entry: JobEntry, calibration: Calibration | None = None) -> str | None:
        """Why the job's step is likely bound by its host, on any accelerator (`host_bound_reason`; None: no sign
        of it), from its zoo model and its own reports (`calibration`, else the job's last)."""
        reported = (calibration if calibration is not None else entry.calibration).slowest_over_device_time
        return host_bound_reason(entry.spec, reported)

    def applied(self, entry: JobEntry, accelerator: str, devices: int, communication_share: float,
                calibration: Calibration | None = None, fleet: FleetCalibration | None = None,
                interval_ms: Sequence[float] | None = None) -> Applied:
        """What calibrates `entry` on `devices` × `accelerator`: its own observations there, at that device count
        (level `job`; with the served `interval_ms`, narrowed as far as they agree: `own_interval_scale`), else the
        fleet's evidence (`FleetCalibration.apply`: the job at other device counts or elsewhere, through its compute
        and the links apart; other jobs on the accelerator or its chip), else nothing."""
        calibration = calibration if calibration is not None else entry.calibration
        factor, count = calibration.factor(accelerator, devices)
        if count and devices in calibration.device_counts.get(accelerator, frozenset()):
            log_sigma = calibration.log_sigma(accelerator)
            scale = 1.0 if log_sigma is None or interval_ms is None else own_interval_scale(log_sigma, interval_ms)
            return Applied(level="job", throughput_factor=factor, observations=count, jobs=1, interval_scale=scale,
                           log_sigma=log_sigma, sources={"job": {"observations": count, "jobs": 1}})
        fleet = fleet if fleet is not None else self._fleet
        if not len(fleet):
            return Applied()
        applied = fleet.apply(self._query(entry, accelerator, communication_share))
        if interval_ms is None:
            return applied
        # the job's own reports (at other device counts here, or on other accelerators): an answer where it never
        # ran is no surer than where it did (the fleet's narrowing is against its own prior, wider than the served
        # band); where it ran on several accelerators, no surer than on the one its reports agree best
        kind = getattr(self.catalog.get(accelerator), "kind", None)
        sigmas = [sigma for sigma in (calibration.log_sigma(name) for name in calibration.device_counts
                                      if getattr(self.catalog.get(name), "kind", None) == kind)
                  if sigma is not None]
        if sigmas:
            floor = own_interval_scale(min(sigmas), interval_ms)
            if applied.interval_scale < floor:
                applied = replace(applied, interval_scale=floor)
        return applied

    def within_physics(self, entry: JobEntry, placement: PlacementSpec, raw_throughput_samples_per_s: float,
                       applied: Applied, calibration: Calibration | None = None) -> Applied:
        """`applied` with its factor lowered where it would lift the answer above the placement's peak FLOP/s
        (`ceiling_samples_per_s`), and kept within linear scaling of the job's own answers at the other device
        counts it reported on the accelerator (`_within_scaling`)."""
        if raw_throughput_samples_per_s <= 0:
            return applied
        if applied.throughput_factor > 1:
            ceiling = ceiling_samples_per_s(entry.spec, entry.graph, placement, self.catalog)
            applied = replace(applied, throughput_factor=min(applied.throughput_factor,
                                                             ceiling / raw_throughput_samples_per_s))
        return self._within_scaling(entry, placement, raw_throughput_samples_per_s, applied,
                                    calibration if calibration is not None else entry.calibration)

    def _within_scaling(self, entry: JobEntry, placement: PlacementSpec, raw_throughput_samples_per_s: float,
                        applied: Applied, calibration: Calibration) -> Applied:
        """Where the job reported other device counts n on the accelerator (data parallelism, same per-device batch):
        the answer at m devices is at most m/n times its own answer at n < m (never faster than linear), and, where
        m has no report of its own, at least m/n times its own answer at n > m (what n devices did, fewer did at
        no worse than linear). Its reports at different counts are each right where they ran; the fleet's answer
        between them may not be (a job effect shared with its other batches)."""
        parallelism = placement.parallelism
        if parallelism.devices != parallelism.data or parallelism.micro_batches != 1:
            return applied
        hardware = self.hardware(placement.accelerator)
        name = hardware.name
        counts = calibration.device_counts.get(name, frozenset())
        m = placement.devices
        others = sorted(n for n in counts if n != m)
        if not others:
            return applied
        # n devices laid out as the asked placement's nodes, else as the accelerator's servers
        per_node = max(placement.devices_per_node) if placement.nodes > 1 else max(hardware.node_devices or 8, m)
        low, high = 0.0, math.inf
        for n in others:
            if n > m and m in counts:
                continue
            layout = (per_node,) * (n // per_node) + ((n % per_node,) if n % per_node else ())
            at_n = placement.model_copy(update={
                "devices_per_node": layout, "parallelism": data_parallel(n),
                "global_batch_size": placement.global_batch_size // m * n})
            own_n = self._raw(self.predictor, entry, at_n, ("placement",)).throughput_samples_per_s
            own_n *= calibration.factor(name, n)[0]
            if n < m:
                high = min(high, own_n * m / n)
            else:
                low = max(low, own_n * m / n)
        value = raw_throughput_samples_per_s * applied.throughput_factor
        bounded = min(max(value, low), high)
        if bounded == value:
            return applied
        return replace(applied, throughput_factor=bounded / raw_throughput_samples_per_s)

    def _query(self, entry: JobEntry, accelerator: str, communication_share: float) -> FleetQuery:
        from perfmodel.hardware.chips import die_of
        from perfmodel.predictor.math_modes import conv_flop_share

        hardware = self.hardware(accelerator)
        # the CPU is priced by a model of its own: a job's error there says nothing of its error on GPUs (and back)
        job = entry.model_key if hardware.kind != "cpu" else f"{entry.model_key}@cpu"
        return FleetQuery(job=job, accelerator=hardware.name, chip=die_of(hardware.name),
                          architecture=hardware.architecture or hardware.name, precision=entry.spec.precision.value,
                          communication_share=communication_share, conv_share=conv_flop_share(entry.graph.totals))

    # --- co-location --------------------------------------------------------------------------------------------

    def colocation(self, refs: Sequence[str | JobSpec], given: PlacementTemplate | PlacementSpec,
                   sharing: Sharing = "time-slicing") -> dict[str, Any]:
        """Two jobs sharing the placement's devices: each one's throughput while they do, next to its isolated
        (calibrated) answer (`perfmodel.placement.colocation`), each calibrated by what it reported while sharing
        that accelerator (`perfmodel.calibration.sharing`). A pair whose memory does not fit together is refused
        (FieldError at `jobs`). Blocking."""
        from perfmodel.placement.colocation import combined_device_share, shared_interval

        if len(refs) != 2:
            raise FieldError(("jobs",), f"co-location takes exactly two jobs, got {len(refs)}")
        entries = [self.job(ref, ("jobs", i)) for i, ref in enumerate(refs)]
        pair = self._pair(entries, given, sharing, calibrated=True)
        params = pair.params
        answers, jobs, placements = pair.answers, pair.jobs, pair.placements
        out_throughput, intervals, slowdowns = [], [], []
        for answer, job, step_ms, applied in zip(answers, jobs, pair.steps_ms, pair.applied):
            slowdown = step_ms / job.step_ms if job.step_ms > 0 else 1.0
            alone = answer["throughput_samples_per_s"]
            low_ms, high_ms = answer["interval_ms"]
            iteration = answer["iter_time_ms"]
            throughput = alone / slowdown
            out_throughput.append(throughput)
            isolated = (alone * iteration / high_ms, alone * iteration / low_ms)
            model = shared_interval(throughput, isolated, slowdown, params.kept_band_log)
            band = params.reported_band(applied.observations)
            if band is not None:  # reported: its reports set its level; left is their error on its other pairs,
                # never wider than the model's own interval (evidence does not widen it; only reports that disagree)
                point = min(throughput, isolated[1])
                if point > 0 and model[0] > 0:
                    band = (max(band[0], math.log(model[0] / point)), min(band[1], math.log(model[1] / point)))
                band = reported_band(band, applied)
            intervals.append([throughput * math.exp(band[0]), min(throughput * math.exp(band[1]), isolated[1])]
                             if band is not None else list(model))
            slowdowns.append(slowdown)
        return {
            "jobs": [e.key for e in entries], "accelerator": answers[0]["accelerator"],
            "devices": placements[0].devices, "sharing": sharing,
            "throughput_samples_per_s": out_throughput,
            "steps_per_s": [t / p.global_batch_size * p.parallelism.data * p.parallelism.micro_batches
                            for t, p in zip(out_throughput, placements)],
            "interval_samples_per_s": intervals,
            "isolated_throughput_samples_per_s": [a["throughput_samples_per_s"] for a in answers],
            "slowdown": slowdowns,
            "device_share": pair.device_share,
            "combined_device_share": combined_device_share((jobs[0], jobs[1]), pair.steps_ms, sharing),
            "sm_fill": [job.sm_fill for job in jobs],
            "bandwidth_share": [job.bandwidth_share for job in jobs],
            "calibration": [a.as_dict() for a in pair.applied],
            "peak_memory_bytes": pair.memory, "memory_capacity_bytes": pair.capacity, "fits": True,
            "isolated": answers, "model_versions": self.model_versions,
        }

    def _pair(self, entries: Sequence[JobEntry], given: PlacementTemplate | PlacementSpec, sharing: Sharing,
              calibrated: bool) -> SharedPair:
        """The two jobs' isolated answers on the placement and their steps while sharing it: the co-location
        model's, then (`calibrated`) each job's by what it reported while sharing the accelerator in that mode."""
        params = self.colocation_params(given.accelerator)
        answers: list[dict[str, Any]] = []
        jobs: list[SharingJob] = []
        placements: list[PlacementSpec] = []
        for entry in entries:
            placement = self.placement(given, entry.spec.batch_size)
            self.check_ir_batch(entry, placement)
            answer, job = self.sharing_input(entry, placement, params.host_share_of_gap)
            answers.append(answer)
            placements.append(placement)
            jobs.append(job)
        capacity = answers[0]["memory_capacity_bytes"]
        if capacity is not None:  # each job is its own process, with its own CUDA context
            capacity = shared_capacity_bytes(capacity, len(answers))
        memory = [int(a["peak_memory_bytes"]) for a in answers]
        if capacity is not None and sum(memory) > capacity:
            raise FieldError(("jobs",), (
                f"the two jobs do not fit together: {memory[0] / 2**30:.2f} + {memory[1] / 2**30:.2f} GiB per device "
                f"> {capacity / 2**30:.2f} GiB usable on {answers[0]['accelerator']}"))
        applied = ((self.sharing_applied(entries[0], answers[0]["accelerator"], sharing),
                    self.sharing_applied(entries[1], answers[1]["accelerator"], sharing))
                   if calibrated else (SharingApplied(), SharingApplied()))
        shared, steps = share_calibrated(jobs[0], jobs[1], sharing, params, [a.factor for a in applied])
        device_share = [busy * before / after if after > 0 else 0.0  # the same device time over a longer step
                        for busy, before, after in zip(shared.device_share, shared.step_ms, steps)]
        return SharedPair(answers, jobs, placements, steps, applied, device_share, memory, capacity, params)

    def colocation_params(self, accelerator: str) -> ColocationParams:
        """The co-location constants fitted for GPUs that preempt compute as `accelerator` does (its architecture:
        `placement.colocation.preemption_of`)."""
        from perfmodel.placement.colocation import load_colocation_params, preemption_of

        return load_colocation_params(preemption=preemption_of(getattr(self.hardware(accelerator), "architecture",
                                                                       None)))

    def sharing_applied(self, entry: JobEntry, accelerator: str, sharing: Sharing) -> SharingApplied:
        """What calibrates the job's answer while sharing `accelerator` in `sharing` mode: its reports there, at the
        heavier prior where its own isolated reports calibrate its answer there (`calibration.sharing`)."""
        known = accelerator in self.calibration(entry).by_accelerator  # its own isolated reports there
        return self.sharing_calibration(entry).applied(accelerator, sharing, isolated_known=known)

    def sharing_calibration(self, entry: JobEntry) -> SharingCalibration:
        """The job's reports while sharing against what the service answers for each of those pairs without them
        (recomputed when the model, the job's observations or the fleet changed). Blocking: it predicts every
        reported pair."""
        if not entry.shared:
            return SharingCalibration()
        at = (self.generation, entry.revision, self.fleet_revision)
        if entry.sharing_at == at:
            return entry.sharing
        points = []
        for o in entry.observations:
            if o.colocated_with is None:  # alone on its GPUs: not a report while sharing (`JobEntry.shared`)
                continue
            sharing: Sharing = "mps" if o.sharing == "mps" else "time-slicing"  # stored as `_observe_shared` wrote it
            try:
                partner = self.job(o.colocated_with)
                placement = SamePlacement(PlacementSpec.model_validate(o.placement))
                pair = self._pair([entry, partner], placement, sharing, calibrated=False)
            except (NotFound, FieldError, PerfmodelError) as exc:  # the partner was deleted, the model changed
                log.warning("shared observation %s of job %s left out: %s", o.id, entry.key, exc)
                continue
            answered = pair.answers[0]["throughput_samples_per_s"] * pair.jobs[0].step_ms / pair.steps_ms[0]
            points.append(SharedPoint(o.id, o.accelerator, sharing, o.colocated_with,
                                      math.log(o.throughput_samples_per_s / answered)))
        calibration = calibrate_sharing(points)
        with self._lock:
            if (self.generation, entry.revision, self.fleet_revision) == at:
                entry.sharing, entry.sharing_at = calibration, at
        return calibration

    def sharing_input(self, entry: JobEntry, placement: PlacementSpec, host_share_of_gap: float
                      ) -> tuple[dict[str, Any], SharingJob]:
        """The job's calibrated answer on the placement, and its step as the co-location model sees it."""
        raw = self._raw(self.predictor, entry, placement, ("placement",))
        answer = self.respond(entry, raw, self.calibration(entry), self.fleet())
        composition = self.predictor.composition(entry.spec, placement) or {}  # none from kernels: all of it
        return answer, sharing_job(raw, answer["iter_time_ms"], host_share_of_gap, composition.get("sm_fill", 1.0),
                                   composition.get("bandwidth_share", 1.0))

    # --- calibration --------------------------------------------------------------------------------------------

    def _current_calibration(self, entry: JobEntry) -> Calibration | None:
        if not entry.alone:
            return NO_CALIBRATION
        if entry.calibrated_at == (self.generation, entry.revision):
            return entry.calibration
        return None

    def calibration(self, entry: JobEntry) -> Calibration:
        """The job's calibration against the serving model (recomputed when either changed). Blocking: it runs the
        model on every observation's placement."""
        current = self._current_calibration(entry)
        if current is not None:
            return current
        generation, predictor = self.generation, self.predictor
        with self._lock:
            revision, observations = entry.revision, entry.alone
        predicted: dict[PlacementSpec, Prediction] = {}
        placements = [PlacementSpec.model_validate(o.placement) for o in observations]
        for placement in dict.fromkeys(placements):
            try:
                predicted[placement] = predictor.predict(entry.spec, placement, graph=entry.graph)
            except PerfmodelError as exc:  # e.g. its accelerator left the catalog: the point is left out
                log.warning("observation placement of job %s no longer predictable: %s", entry.key, exc)
        points = [ObservedPoint(o.id, predicted[p].accelerator, o.devices, o.throughput_samples_per_s,
                                predicted[p].throughput_samples_per_s, o.created_at,
                                device_time_ms(predicted[p].breakdown_ms) / predicted[p].iter_time_ms)
                  for o, p in zip(observations, placements) if p in predicted]
        calibration = calibrate(points, now=utc_now())
        weights = dict(zip((p.id for p in points), recency_weights(points, calibration.now)))
        fleet_points = tuple(
            FleetPoint(o.id, q.job, q.accelerator, q.chip, q.architecture, q.precision,
                       log_ratio=math.log(predicted[p].throughput_samples_per_s / o.throughput_samples_per_s),
                       communication_share=q.communication_share, weight=weights[o.id])
            for o, p in zip(observations, placements) if p in predicted
            for q in [self._query(entry, predicted[p].accelerator, _communication_share(predicted[p].breakdown_ms,
                                                                                 predicted[p].iter_time_ms))])
        with self._lock:
            if entry.revision == revision:
                entry.calibration, entry.calibrated_at = calibration, (generation, revision)
                entry.fleet_points = fleet_points
        return calibration

    # --- the fleet ----------------------------------------------------------------------------------------------

    def _fleet_changed(self) -> None:
        with self._lock:
            self.fleet_revision += 1

    def _current_fleet(self) -> FleetCalibration | None:
        if self._fleet_at == (self.generation, self.fleet_revision):
            return self._fleet
        return None

    def fleet(self) -> FleetCalibration:
        """The fleet calibration over every observed job's observations (each job's own outliers left out),
        refitted when the model or any observation changed. Blocking: it loads and calibrates observed jobs.

        While the store does not answer (down, restarting), the fleet fitted last is returned, and the refit is
        tried again at most every `FLEET_RETRY_S`: predictions of jobs in memory go on, a little stale at worst."""
        current = self._current_fleet()
        if current is not None:
            return current
        fitted_before = self._fleet_at != (-1, -1)
        if fitted_before and time.monotonic() < self._fleet_retry_at:
            return self._fleet
        generation, revision = self.generation, self.fleet_revision
        points: list[FleetPoint] = []
        try:
            for key in self.store.observed_job_ids() if self.store is not None else ():
                try:
                    entry = self.job(key)
                except NotFound:  # deleted meanwhile
                    continue
                excluded = {e.id for e in self.calibration(entry).excluded}
                points.extend(p for p in entry.fleet_points if p.id not in excluded)
        except SQLAlchemyError as exc:
            if not fitted_before:
                raise
            self._fleet_retry_at = time.monotonic() + FLEET_RETRY_S
            log.warning("the store did not answer (%s): the fleet calibration fitted before is used until it does",
                        type(exc).__name__)
            return self._fleet
        fleet = fit_fleet([*points, *self._device_points()], self.config.fleet_priors)
        with self._lock:
            if (self.generation, self.fleet_revision) == (generation, revision):
                self._fleet, self._fleet_at = fleet, (generation, revision)
        return fleet

    def calibration_report(self, entry: JobEntry) -> dict[str, Any]:
        """Counts, factors per accelerator and device count, excluded points and why, the error before and after
        (leave-one-out), and the latest observations. Blocking."""
        calibration = self.calibration(entry)
        report = calibration.report()
        report["sharing"] = self.sharing_calibration(entry).report(lambda name: name in calibration.by_accelerator)
        excluded = {e.id: e.reason for e in calibration.excluded}
        created = {o.id: o for o in entry.observations}
        recent = [p for p in calibration.points if p.id in created][::-1][:RECENT_OBSERVATIONS]
        calibrated = leave_one_out(calibration.points, recent, now=calibration.now)
        report["recent"] = [
            {"id": p.id, "accelerator": p.accelerator, "devices": p.devices,
             "throughput_samples_per_s": p.observed_throughput_samples_per_s,
             "predicted_throughput_samples_per_s": p.predicted_throughput_samples_per_s,
             "calibrated_throughput_samples_per_s": value, "created_at": created[p.id].created_at,
             "excluded": excluded.get(p.id)}
            for p, value in zip(recent, calibrated)]
        return report

    def _device_points(self) -> list[FleetPoint]:
        """The whole steps `perfmodel hw bench` kept for devices of this catalog, against the serving model."""
        from perfmodel.calibration.fleet import reference_points
        from perfmodel.predictor.math_modes import conv_flop_share
        from perfmodel.store.device_steps import load_device_steps, signature

        self._steps_seen = signature()
        by_device: dict[str, list[tuple[str, str, float, float, float]]] = {}
        for step in load_device_steps():
            try:
                hardware = self.hardware(step.accelerator)
                graph = self.graphs.put(step.spec, Graph.from_json(step.graph_json))
                placement = PlacementSpec(accelerator=hardware.name, global_batch_size=step.spec.batch_size)
                predicted = self.predictor.predict(step.spec, placement, graph=graph)
            except PerfmodelError as exc:  # a device that left the catalog, a model that cannot price it
                log.warning("kept step of %s on %s left out: %s", step.spec.name, step.accelerator, exc)
                continue
            model_key = step.spec.model_copy(update={"batch_size": 1}).key()
            by_device.setdefault(hardware.name, []).append(
                (model_key, step.spec.precision.value, step.measured_ms, predicted.iter_time_ms,
                 conv_flop_share(graph.totals)))
        points = [p for name, steps in by_device.items() for p in reference_points(steps, self.hardware(name))]
        return [replace(p, id=-(i + 1)) for i, p in enumerate(points)]  # ids unique across devices

    # --- observations -------------------------------------------------------------------------------------------

    def observe(self, job_id: str, given: PlacementTemplate | PlacementSpec, throughput_samples_per_s: float,
                where: Loc = ("placement",), *, colocated_with: str | None = None,
                sharing: Sharing = "time-slicing") -> dict[str, Any]:
        """Check what a registered job measured against physics and the model, store it, recalibrate. With
        `colocated_with` (a registered job's id), the job measured it while sharing the placement's GPUs with that
        job in `sharing` mode: it calibrates the job's answers while sharing (`sharing_calibration`), never its
        isolated ones. Blocking."""
        assert self.store is not None
        entry = self.job(job_id)
        placement = self.placement(given, entry.spec.batch_size, where)
        self.check_ir_batch(entry, placement, where)
        if colocated_with is not None:
            return self._observe_shared(entry, placement, throughput_samples_per_s, colocated_with, sharing)
        predicted = self._raw(self.predictor, entry, placement, where)
        ceiling = ceiling_samples_per_s(entry.spec, entry.graph, placement, self.catalog)
        try:
            check_observation(throughput_samples_per_s, ceiling_samples_per_s=ceiling,
                              predicted_samples_per_s=predicted.throughput_samples_per_s,
                              samples_per_step=placement.per_replica_batch_size)
        except ObservationRefused as exc:
            raise FieldError((exc.field,), str(exc)) from None
        placement = placement.model_copy(update={"accelerator": predicted.accelerator})  # stored by catalog name
        record = self.store.add_observation(
            entry.key, placement=placement.model_dump(mode="json"), accelerator=predicted.accelerator,
            devices=placement.devices, throughput_samples_per_s=throughput_samples_per_s,
            predicted_throughput_samples_per_s=predicted.throughput_samples_per_s,
            model_version=predicted.model_version)
        self._add_observations(entry, [record])
        calibration = self.calibration(entry)
        self.fleet()
        factor, count = calibration.factor(predicted.accelerator, placement.devices)
        excluded = {e.id: e.reason for e in calibration.excluded}
        error_pct = 100.0 * (predicted.throughput_samples_per_s - throughput_samples_per_s) / throughput_samples_per_s
        message = (f"stored; predictions of job {entry.key} on {placement.devices} × {predicted.accelerator} are "
                   f"calibrated by ×{factor:.3f} (recency-weighted median of observed / predicted over {count} "
                   f"observation(s))")
        if record.id in excluded:
            message += f"; this observation is excluded: {excluded[record.id]}"
        elif count:
            served = self.within_physics(entry, placement, predicted.throughput_samples_per_s, Applied(
                level="job", throughput_factor=factor, observations=count, jobs=1), calibration).throughput_factor
            if not math.isclose(served, factor, rel_tol=1e-6):
                message += (f"; answered ×{served:.3f}: within linear scaling of the job's own reports at other "
                            f"device counts on {predicted.accelerator} (faster than linear over them, or slower "
                            f"than fewer devices did)")
        return {
            "observation_id": record.id, "job_id": entry.key, "accelerator": predicted.accelerator,
            "throughput_samples_per_s": throughput_samples_per_s,
            "predicted_throughput_samples_per_s": predicted.throughput_samples_per_s, "error_pct": error_pct,
            "calibrated": count > 0, "calibration_factor": factor, "observations": count,
            "excluded": excluded.get(record.id), "message": message,
        }

    def _observe_shared(self, entry: JobEntry, placement: PlacementSpec, throughput_samples_per_s: float,
                        colocated_with: str, sharing: Sharing) -> dict[str, Any]:
        """`observe` of a job measured while sharing the placement with job `colocated_with`."""
        assert self.store is not None
        try:
            partner = self.job(colocated_with)
        except NotFound:
            raise FieldError(("colocated_with",), f"no registered job {colocated_with!r}: register it with POST "
                                                  "/v1/jobs and pass its job_id") from None
        if not partner.registered:
            raise FieldError(("colocated_with",), "the other job must be a registered job (its job_id)")
        try:
            pair = self._pair([entry, partner], SamePlacement(placement), sharing, calibrated=False)
        except FieldError as exc:
            if exc.loc != ("jobs",):
                raise
            raise FieldError(("colocated_with",), str(exc)) from None  # the pair does not fit in memory together
        answered = pair.answers[0]["throughput_samples_per_s"] * pair.jobs[0].step_ms / pair.steps_ms[0]
        ceiling = ceiling_samples_per_s(entry.spec, entry.graph, pair.placements[0], self.catalog)
        try:
            check_observation(throughput_samples_per_s, ceiling_samples_per_s=ceiling,
                              predicted_samples_per_s=answered,
                              samples_per_step=pair.placements[0].per_replica_batch_size)
        except ObservationRefused as exc:
            raise FieldError((exc.field,), str(exc)) from None
        accelerator = pair.answers[0]["accelerator"]
        stored = pair.placements[0].model_copy(update={"accelerator": accelerator})
        record = self.store.add_observation(
            entry.key, placement=stored.model_dump(mode="json"), accelerator=accelerator, devices=stored.devices,
            throughput_samples_per_s=throughput_samples_per_s, predicted_throughput_samples_per_s=answered,
            model_version=pair.answers[0]["model_version"], colocated_with=partner.key, sharing=sharing)
        self._add_observations(entry, [record])
        applied = self.sharing_applied(entry, accelerator, sharing)
        error_pct = 100.0 * (answered - throughput_samples_per_s) / throughput_samples_per_s
        message = (f"stored; the answers of job {entry.key} while sharing {accelerator} ({sharing}) with any job are "
                   f"calibrated by ×{applied.factor:.3f} (the mean log ratio of {applied.observations} report(s) "
                   f"with {applied.partners} other job(s), shrunk toward 1); its answers alone are not changed")
        return {
            "observation_id": record.id, "job_id": entry.key, "accelerator": accelerator,
            "throughput_samples_per_s": throughput_samples_per_s,
            "predicted_throughput_samples_per_s": answered, "error_pct": error_pct,
            "calibrated": applied.observations > 0, "calibration_factor": applied.factor,
            "observations": applied.observations, "excluded": None, "message": message,
            "colocated_with": partner.key, "sharing": sharing,
        }

    def _add_observations(self, entry: JobEntry, records: Sequence[ObservationRecord]) -> None:
        with self._lock:
            known = {o.id for o in entry.observations}
            new = [r for r in records if r.id not in known]
            if new:
                entry.observations = sorted([*entry.observations, *new], key=lambda o: o.id)
                entry.revision += 1
                self.fleet_revision += 1

    def _drop_observations(self, entry: JobEntry, ids: set[int]) -> None:
        with self._lock:
            kept = [o for o in entry.observations if o.id not in ids]
            if len(kept) != len(entry.observations):
                entry.observations = kept
                entry.revision += 1
                self.fleet_revision += 1

    def observation(self, observation_id: int) -> dict[str, Any]:
        """One stored observation. Blocking."""
        assert self.store is not None
        record = self.store.observation(observation_id)
        if record is None:
            raise NotFound(f"no observation {observation_id}")
        return record.model_dump(mode="json")

    def delete_observation(self, observation_id: int) -> dict[str, Any]:
        """Delete one observation and recalibrate its job; the deleted record and the job's new calibration.
        Blocking."""
        assert self.store is not None
        record = self.store.delete_observation(observation_id)
        if not record:
            raise NotFound(f"no observation {observation_id}")
        cached = self._jobs.peek(record.job_id)
        if cached is not None:
            self._drop_observations(cached, {observation_id})
        else:
            self._fleet_changed()
        self.fleet()
        try:
            entry = self.job(record.job_id)
        except NotFound:  # the job went with it meanwhile
            return {"deleted": record.model_dump(mode="json"), "job_id": record.job_id, "calibration": None}
        return {"deleted": record.model_dump(mode="json"), "job_id": entry.key,
                "calibration": self.calibration_report(entry)}

    # --- models -------------------------------------------------------------------------------------------------

    def _serve(self, predictor: Placements) -> None:
        self.predictor = predictor
        self.generation += 1
        for listener in self._listeners:
            listener(predictor.model_versions)

    def promote(self, version: str, by: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Load `version` with the other role's model; on success record the promotion in the store (every worker
        follows it) and the registry, and serve it; on failure keep serving the old model and raise Refused.
        The store's event says who asked (`by`, e.g. the service and its client), the role and the previous model,
        as the command line's and retrain's do. Blocking."""
        about: dict[str, Any] = {**(by or {}), "models_dir": str(self.lifecycle.registry.root)}
        with self._promote_lock:
            try:
                ref, role, refs = self.lifecycle.prepare_promotion(version)
            except (NotFound, Refused):
                raise
            except PerfmodelError as exc:  # an unreadable manifest somewhere in the registry
                raise self._refused(version, exc, about) from None
            about = {"role": role, **about}
            try:
                loaded = self._load_predictor(refs)
            except LOAD_ERRORS as exc:
                raise self._refused(ref, exc, about) from None
            previous = self.predictor.model_versions
            self.lifecycle.record("promoted", ref, json.dumps({**about, "previous": previous.get(role)}))
            try:
                self.lifecycle.registry.set_promoted(ref, role)
            except OSError as exc:  # a read-only registry: the store still says it, every worker follows
                log.warning("promoted %s in the store; the registry's promoted.json is not updated: %s", ref, exc)
            self._serve(loaded)
            log.info("promoted %s: now serving %s", ref, loaded.model_versions)
            return {"promoted": ref, "serving": loaded.model_versions, "previous": previous}

    def _refused(self, ref: str, exc: BaseException, about: Mapping[str, Any]) -> Refused:
        reason = str(exc) if isinstance(exc, PerfmodelError) else f"{type(exc).__name__}: {exc}"
        reason = " ".join(reason.split())[:1000]
        self.lifecycle.record("refused", ref, json.dumps({**about, "reason": reason}))
        log.warning("refused to promote %s: %s", ref, reason)
        return Refused(f"model {ref} was not promoted, its artifact does not load ({reason}); still serving "
                       f"{', '.join(self.predictor.model_versions.values())}")

    def models(self, events: int = 20) -> dict[str, Any]:
        """The registry's models (PerfmodelError if it cannot be read), which is promoted (what the store promotes
        for its role, else promoted.json: `promoted_by_store`), what is served, the latest events."""
        from perfmodel.engine.models import promoted_by_store
        from perfmodel.registry.registry import role_of

        entries = self.lifecycle.registry.entries()
        serving = self.predictor.model_versions
        promoted = set(promoted_by_store(self.lifecycle.registry, self.store).values())
        stored = self.store.model_events(events) if self.store is not None else []
        return {
            "serving": serving,
            "pinned": self.lifecycle.pin.ref if self.lifecycle.pin is not None else None,
            "models": [{"model": e.ref, "regressor": e.manifest.regressor, "role": role_of(e.manifest.regressor),
                        "promoted": e.ref in promoted, "serving": e.ref in serving.values(),
                        "training_samples": e.manifest.training_samples,
                        "created_at": e.manifest.created_at.isoformat(), "metrics": e.manifest.metrics}
                       for e in entries],
            "events": [{"action": e.action, "model_version": e.model_version, "detail": e.detail,
                        "created_at": e.created_at.isoformat()} for e in stored],
        }

    # --- keeping up with other workers --------------------------------------------------------------------------

    def sync_once(self) -> None:
        """Pick up what other processes wrote: new and deleted observations, deleted jobs, promotions. Blocking."""
        if self.store is None:
            return
        new: dict[str, list[ObservationRecord]] = {}
        for record in self.store.observations(after_id=self._last_observation_id):
            self._last_observation_id = max(self._last_observation_id, record.id)
            new.setdefault(record.job_id, []).append(record)
        if new:
            self._fleet_changed()  # observations of jobs not in memory count for the fleet too
        for key, records in new.items():
            entry = self._jobs.peek(key)
            if entry is not None and entry.registered:
                self._add_observations(entry, records)
        registered = [(k, e) for k, e in self._jobs.items() if e.registered]
        keys = self.store.job_ids()
        for key, _ in registered:
            if key not in keys:
                self._jobs.pop(key)
                self._fleet_changed()
        observed = [(k, e) for k, e in registered if k in keys and e.observations]
        for start in range(0, len(observed), SYNC_KEYS_PER_QUERY):
            chunk = dict(observed[start:start + SYNC_KEYS_PER_QUERY])
            for key, ids in self.store.observation_ids(chunk).items():
                entry = chunk[key]
                gone = {o.id for o in entry.observations} - ids
                if gone:
                    self._drop_observations(entry, gone)
        catalog = self.catalog
        if isinstance(catalog, LiveCatalog):  # custom accelerators other processes added
            from perfmodel.store.accelerators import custom_accelerators

            catalog.refresh(custom_accelerators(self.store))
        self.sync_models()
        from perfmodel.store.device_steps import signature

        if signature() != self._steps_seen:  # `perfmodel hw bench` kept new steps
            self._fleet_changed()
        self.fleet()

    def sync_models(self) -> None:
        """Serve what the store promotes (the pin kept) if it differs from what is served. Blocking."""
        if not self.lifecycle.changed_since_seen():
            return
        with self._promote_lock:
            wanted = self.lifecycle.wanted()
            if self.lifecycle.resolved(wanted) == self.predictor.model_versions:
                return
            try:
                loaded = self._load_predictor(wanted)
            except LOAD_ERRORS as exc:
                log.warning("the store promotes %s but it does not load (%s): still serving %s", wanted, exc,
                            self.predictor.model_versions)
                return
            self._serve(loaded)
            log.info("now serving %s (promoted elsewhere)", loaded.model_versions)


def own_interval_scale(log_sigma: float, interval_ms: Sequence[float]) -> float:
    """How much a job's own observations on the accelerator narrow the served 80 % interval: their predictive
    spread (`Calibration.log_sigma`) against the interval's, never wider than served."""
    low, high = interval_ms
    served_sigma = math.log(high / low) / (2 * Z80) if low > 0 and high > low else 0.0
    return min(1.0, log_sigma / served_sigma) if served_sigma > 0 else 1.0


def _communication_share(breakdown_ms: Mapping[str, float], iter_time_ms: float) -> float:
    """Communication's share of a predicted step (0 on one device)."""
    return breakdown_ms.get("communication", 0.0) / iter_time_ms if iter_time_ms > 0 else 0.0


def host_bound_reason(spec: JobSpec, reported: tuple[str, float] | None) -> str | None:
    """Why a job's step is likely bound by its host rather than by the device (None: no sign of it): its zoo
    model's reference implementation does work on the host the graph does not show (`ZooEntry.host_work`), or its
    own reports on some accelerator (`reported`: `Calibration.slowest_over_device_time`) put its step over
    `HOST_BOUND_RATIO` times the predicted device time there. Such a step gains less from a faster GPU than the
    device time says, on any accelerator."""
    from perfmodel.jobs.zoo import find_entry  # the zoo's builders import torch: not at the engine's import

    if isinstance(spec.source, ZooSource):
        entry = find_entry(spec.source.name)
        if entry is not None and entry.host_work:
            return (f"{entry.name}'s reference implementation {entry.host_work}, which the graph does not show: a "
                    f"faster GPU speeds it up less than the device time says")
    if reported is not None and reported[1] > HOST_BOUND_RATIO:
        accelerator, ratio = reported
        return (f"its own reports on {accelerator} run at {ratio:.1f}x the predicted device time there: what bounds "
                f"it (an input pipeline, the host) is not in the graph, and a faster GPU speeds it up less than the "
                f"device time says")
    return None


def sharing_job(raw: Prediction, calibrated_ms: float, host_share_of_gap: float, sm_fill: float = 1.0,
                bandwidth_share: float = 1.0) -> SharingJob:
    """A job's isolated step for the co-location model: device time (forward, backward, optimizer, communication)
    and host time (exposed overhead, pipeline bubble), the calibrated step (`colocation.split_step`), and the shares
    of the device's compute units and memory bandwidth its kernels hold (`sm_fill`, `bandwidth_share`)."""
    from perfmodel.placement.colocation import split_step

    b = raw.breakdown_ms
    device = device_time_ms(b)
    host = sum(b.get(k, 0.0) for k in ("overhead", "pipeline_bubble"))
    if device + host <= 0:
        return SharingJob(device, host, sm_fill, bandwidth_share)
    return split_step(calibrated_ms, device, host, host_share_of_gap, sm_fill, bandwidth_share)


def live_catalog(store: Store | None) -> LiveCatalog:
    """Shipped + local catalog entries and the store's custom accelerators (`hardware.custom.LiveCatalog`)."""
    from perfmodel.hardware.catalog import load_catalog
    from perfmodel.store.accelerators import custom_accelerators

    return LiveCatalog(load_catalog(), custom_accelerators(store) if store else ())


def load_placement_predictor(config: EngineConfig, graphs: GraphCache, catalog: Mapping[str, HardwareSpec],
                             refs: dict[str, str | None]) -> Placements:
    """The prediction model of `refs` (role -> NAME/VERSION, None: the promoted one), resolving accelerators in
    `catalog` and taking graphs of other micro-batches from the engine's `graphs`."""
    from perfmodel.predictor.placed import PlacementPredictor

    predictor = PlacementPredictor.load(config.models_dir, refs=refs, cache_size=config.max_cached_computes,
                                        graphs=graphs.graph, batch_models=graphs.batch_model)
    predictor.use_catalog(catalog)
    return predictor

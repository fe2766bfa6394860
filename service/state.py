"""What one service process holds: the store, the serving predictor (swapped whole on promotion), and the jobs it
has seen with their graphs and observations, so that a prediction for a known job is a dictionary look-up plus the
placement model: no capture, no database access.

Blocking work (graph capture, database reads and writes, model loading) is done by the methods the routers run
in a worker thread; `cached`, `placement` and `predict` are cheap and run on the event loop.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from perfmodel.errors import PerfmodelError
from perfmodel.graph.ir import Graph
from perfmodel.hardware.catalog import get_accelerator
from perfmodel.jobs.spec import GraphSource, JobSpec
from perfmodel.placement.spec import PlacementSpec
from perfmodel.predictor.predict import Prediction
from perfmodel.store.jobs import JobStore, ObservationRecord
from service import calibration
from service.errors import ApiError, ModelRefused, NotFound, clean_errors, field_error
from service.metrics import Metrics
from service.schemas import PlacementIn
from service.settings import ServiceSettings

log = logging.getLogger("perfmodel.service")

PLACEMENT_CACHE_SIZE = 4096
RECENT_OBSERVATIONS = 20


@dataclass
class JobEntry:
    """A job the process knows: its spec and graph, and (registered jobs) what it observed."""

    key: str
    spec: JobSpec
    graph: Graph
    registered: bool
    created_at: datetime | None = None
    observations: list[ObservationRecord] = field(default_factory=list)
    # accelerator -> (factor, observations), valid for predictor generation `factors_generation`
    factors: dict[str, tuple[float, int]] = field(default_factory=dict)
    factors_generation: int = -1
    points: list[calibration.ObservedPoint] = field(default_factory=list)
    warm: set[tuple[Any, ...]] = field(default_factory=set)  # (accelerator, micro-batch, generation) predicted


def _validation_error(exc: ValidationError, prefix: Sequence[str | int]) -> ApiError:
    """A pydantic error about part of a request, as a 422 naming the field."""
    return ApiError(422, clean_errors([{**error, "loc": (*prefix, *error["loc"])} for error in
                                       exc.errors(include_url=False, include_input=False, include_context=False)]))


class ServiceState:
    def __init__(self, settings: ServiceSettings, store: JobStore, predictor: Any, metrics: Metrics):
        from perfmodel.hardware.catalog import load_catalog
        from perfmodel.registry.registry import ModelRegistry

        self.settings = settings
        self.store = store
        self.predictor = predictor  # replaced whole (one reference assignment) on promotion
        self.generation = 0  # bumped with every new predictor: calibration factors are recomputed
        self.metrics = metrics
        self.registry = ModelRegistry(settings.models_dir)
        self.catalog = load_catalog()
        self._entries: OrderedDict[str, JobEntry] = OrderedDict()
        self._placements: dict[tuple[PlacementIn, int], PlacementSpec] = {}
        self._lock = threading.Lock()  # the job and placement caches
        self._capture_lock = threading.Lock()  # one graph capture at a time (torch.export is not thread-safe)
        self._promote_lock = threading.Lock()
        self._last_observation_id = store.last_observation_id()
        self._promoted_seen: dict[str, str | None] = {}
        self._promoted_seen = self._promoted_refs()
        metrics.set_models(predictor.model_versions)

    # --- jobs -------------------------------------------------------------------------------------------------------

    def cached(self, key: str) -> JobEntry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def _remember(self, entry: JobEntry) -> JobEntry:
        with self._lock:
            known = self._entries.get(entry.key)
            if known is not None and (known.registered or not entry.registered):
                return known  # another thread got there first
            self._entries[entry.key] = entry
            while len(self._entries) > self.settings.max_cached_jobs:
                self._entries.popitem(last=False)
            self.metrics.jobs_cached.set(len(self._entries))
            return entry

    def capture(self, spec: JobSpec) -> Graph:
        """The job's graph: the IR itself for an IR source, else captured on the meta device. A graph that
        cannot be had is the client's problem (422), never a 500."""
        if isinstance(spec.source, GraphSource):
            from perfmodel.graph import graph_for_job

            return graph_for_job(spec)
        with self._capture_lock:
            from perfmodel.graph import graph_for_job

            try:
                return graph_for_job(spec)
            except PerfmodelError:
                raise
            except Exception as exc:  # a config the model code rejects, an unsupported op, ...
                message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise PerfmodelError(f"source: the job's graph could not be captured ({type(exc).__name__}: "
                                     f"{message[:300]})") from None

    def load(self, key: str) -> JobEntry:
        """A registered job from the store (graph and observations); NotFound if there is none. Blocking."""
        cached = self.cached(key)
        if cached is not None and cached.registered:
            return cached
        record = self.store.get_job(key, with_graph=True)
        if record is None:
            raise NotFound(f"no job {key!r}: register it with POST /v1/jobs")
        graph = Graph.from_json(record.graph_json) if record.graph_json else self.capture(record.spec)
        return self._remember(JobEntry(key=key, spec=record.spec, graph=graph, registered=True,
                                       created_at=record.created_at, observations=self.store.observations(key)))

    def inline(self, spec: JobSpec) -> JobEntry:
        """A job given inline (kept in memory, not registered). Blocking: may capture its graph."""
        key = spec.key()
        cached = self.cached(key)
        if cached is not None:
            return cached
        return self._remember(JobEntry(key=key, spec=spec, graph=self.capture(spec), registered=False))

    def register(self, spec: JobSpec, graph: Graph | None = None) -> tuple[JobEntry, bool]:
        """Store the job (once: the same spec gets the same id) with its graph. Blocking."""
        key = spec.key()
        cached = self.cached(key)
        if graph is None:
            graph = cached.graph if cached is not None else self.capture(spec)
        record, created = self.store.add_job(spec, graph.to_json())
        observations = [] if created else self.store.observations(key)
        entry = JobEntry(key=key, spec=spec, graph=graph, registered=True, created_at=record.created_at,
                         observations=observations)
        with self._lock:
            self._entries.pop(key, None)
        return self._remember(entry), created

    def delete(self, key: str) -> None:
        if not self.store.delete_job(key):
            raise NotFound(f"no job {key!r}")
        with self._lock:
            self._entries.pop(key, None)

    # --- predictions ------------------------------------------------------------------------------------------------

    def placement(self, given: PlacementIn, batch_size: int, where: Sequence[str | int]) -> PlacementSpec:
        """The full placement of `given` for a job of `batch_size` (cached); 422 naming the field if invalid."""
        cache_key = (given, batch_size)
        spec = self._placements.get(cache_key)
        if spec is not None:
            return spec
        try:
            get_accelerator(given.accelerator, self.catalog)
        except PerfmodelError as exc:
            raise field_error([*where, "accelerator"], str(exc)) from None
        try:
            spec = given.to_spec(batch_size)
        except ValidationError as exc:
            raise _validation_error(exc, where) from None
        with self._lock:
            if len(self._placements) >= PLACEMENT_CACHE_SIZE:
                self._placements.clear()
            self._placements[cache_key] = spec
        return spec

    def check_ir_batch(self, entry: JobEntry, placement: PlacementSpec, where: Sequence[str | int]) -> None:
        """An IR job's graph holds the shapes of its batch: a placement with another micro-batch is refused."""
        if isinstance(entry.spec.source, GraphSource) and placement.micro_batch_size != entry.spec.batch_size:
            raise field_error(list(where), (
                f"the job's graph IR was captured at batch {entry.spec.batch_size}; this placement runs micro-"
                f"batches of {placement.micro_batch_size} per device (set global_batch_size to "
                f"{entry.spec.batch_size} × parallelism.data × micro_batches, or register the IR of that batch)"))

    def raw_prediction(self, entry: JobEntry, placement: PlacementSpec,
                       where: Sequence[str | int] = ("body", "placement")) -> Prediction:
        """The uncalibrated prediction of one job on one placement; the model's refusals are 422s."""
        try:
            return self.predictor.predict(entry.spec, placement, graph=entry.graph)
        except PerfmodelError as exc:
            raise field_error(list(where), str(exc).removeprefix("placement.")) from None

    def raw_predictions(self, entries: Sequence[JobEntry], placements: Sequence[PlacementSpec],
                        where: Sequence[str | int] = ("body", "placement")) -> list[list[Prediction]]:
        """Uncalibrated predictions of every job on every placement; the model's refusals are 422s."""
        predictor = self.predictor
        try:
            return predictor.predict_matrix([e.spec for e in entries], placements, graphs=[e.graph for e in entries])
        except PerfmodelError as exc:
            raise field_error(list(where), str(exc).removeprefix("placement.")) from None

    def raw_matrix(self, entries: Sequence[JobEntry], placements: Sequence[PlacementSpec],
                   where: Sequence[str | int]) -> dict[str, Any]:
        """`PlacementPredictor.matrix_arrays` of the jobs × placements, uncalibrated: (jobs, placements) arrays
        of the breakdown, `iteration_ms`, `throughput_samples_per_s`, `peak_memory_bytes`, `fits`."""
        try:
            return self.predictor.matrix_arrays([e.spec for e in entries], placements,
                                                graphs=[e.graph for e in entries])
        except PerfmodelError as exc:
            raise field_error(list(where), str(exc).removeprefix("placement.")) from None

    def factors(self, entry: JobEntry) -> dict[str, tuple[float, int]]:
        """accelerator -> (calibration factor, observations) of a job, against the serving model."""
        if entry.factors_generation == self.generation:
            return entry.factors
        if not entry.observations:
            entry.points, entry.factors = [], {}
        else:
            entry.points = self._points(entry)
            entry.factors = calibration.factors(entry.points)
        entry.factors_generation = self.generation
        return entry.factors

    def _points(self, entry: JobEntry) -> list[calibration.ObservedPoint]:
        """The job's observations next to the serving model's uncalibrated predictions of their placements (one
        the model cannot predict any more, e.g. its accelerator left the catalog, is left out)."""
        placements = [PlacementSpec.model_validate(o.placement) for o in entry.observations]
        predicted: dict[PlacementSpec, Prediction] = {}
        for placement in dict.fromkeys(placements):
            try:
                predicted[placement] = self.predictor.predict(entry.spec, placement, graph=entry.graph)
            except PerfmodelError as exc:
                log.warning("observation placement of job %s no longer predictable: %s", entry.key, exc)
        return [calibration.ObservedPoint(o.id, predicted[p].accelerator, o.throughput_samples_per_s,
                                          predicted[p].throughput_samples_per_s)
                for o, p in zip(entry.observations, placements) if p in predicted]

    def respond(self, entry: JobEntry, prediction: Prediction) -> dict[str, Any]:
        """The predict response: the prediction, calibrated by what the job observed on the accelerator."""
        calibration_factor, count = self.factors(entry).get(prediction.accelerator, (1.0, 0))
        data = prediction.model_dump(mode="json")
        data.update(job_id=entry.key, calibrated=count > 0, calibration_factor=calibration_factor,
                    observations=count, uncalibrated_iteration_time_ms=prediction.iteration_time_ms,
                    uncalibrated_throughput_samples_per_s=prediction.throughput_samples_per_s)
        if count:
            data["throughput_samples_per_s"] *= calibration_factor
            data["iteration_time_ms"] /= calibration_factor
            data["interval_ms"] = [bound / calibration_factor for bound in data["interval_ms"]]
            data["breakdown_ms"] = {k: v / calibration_factor for k, v in data["breakdown_ms"].items()}
        return data

    # --- observations -----------------------------------------------------------------------------------------------

    def observe(self, entry: JobEntry, placement: PlacementSpec, throughput: float) -> dict[str, Any]:
        """Store what the job measured, next to the uncalibrated prediction; later predictions are calibrated."""
        predicted = self.raw_prediction(entry, placement)
        record = self.store.add_observation(
            entry.key, placement=placement.model_dump(mode="json"), accelerator=predicted.accelerator,
            devices=placement.devices, throughput_samples_per_s=throughput,
            predicted_throughput_samples_per_s=predicted.throughput_samples_per_s,
            model_version=predicted.model_version)
        with self._lock:
            if all(o.id != record.id for o in entry.observations):
                entry.observations.append(record)
            entry.factors_generation = -1
        calibration_factor, count = self.factors(entry).get(predicted.accelerator, (1.0, 0))
        error_pct = 100.0 * (predicted.throughput_samples_per_s - throughput) / throughput
        return {
            "observation_id": record.id, "job_id": entry.key, "accelerator": predicted.accelerator,
            "throughput_samples_per_s": throughput,
            "predicted_throughput_samples_per_s": predicted.throughput_samples_per_s, "error_pct": error_pct,
            "calibrated": True, "calibration_factor": calibration_factor, "observations": count,
            "message": (f"stored; from now on predictions of job {entry.key} on {predicted.accelerator} are "
                        f"calibrated by ×{calibration_factor:.3f} (geometric mean of observed / predicted over "
                        f"{count} observation(s))"),
        }

    def calibration_report(self, entry: JobEntry) -> dict[str, Any]:
        """Observation count, per-accelerator factors, and the error before and after calibration."""
        by_accelerator = self.factors(entry)
        points = entry.points
        observed = [p.observed_throughput_samples_per_s for p in points]
        loo = calibration.leave_one_out(points)
        created = {o.id: o for o in entry.observations}
        recent = [{"id": p.id, "accelerator": p.accelerator, "devices": created[p.id].devices,
                   "throughput_samples_per_s": p.observed_throughput_samples_per_s,
                   "predicted_throughput_samples_per_s": p.predicted_throughput_samples_per_s,
                   "calibrated_throughput_samples_per_s": c, "created_at": created[p.id].created_at}
                  for p, c in list(zip(points, loo))[::-1][:RECENT_OBSERVATIONS]]
        return {
            "observations": len(points),
            "mape_uncalibrated_pct": calibration.mape_pct([p.predicted_throughput_samples_per_s for p in points],
                                                          observed),
            "mape_calibrated_pct": calibration.mape_pct(loo, observed),
            "by_accelerator": [{"accelerator": acc, "observations": n, "calibration_factor": f}
                               for acc, (f, n) in sorted(by_accelerator.items())],
            "recent": recent,
        }

    # --- models -----------------------------------------------------------------------------------------------------

    def _promoted_refs(self) -> dict[str, str | None]:
        from perfmodel.registry.registry import ROLES

        try:
            return {role: self.registry.promoted_ref(role) for role in ROLES}
        except (OSError, ValueError):  # a promoted.json being replaced or unreadable: look again next time
            return dict(self._promoted_seen)

    def promote(self, version: str) -> dict[str, Any]:
        """Load `version` with the other role's promoted model; on success promote it in the registry and serve it
        (an atomic swap); on failure keep serving the old model and raise ModelRefused. Blocking."""
        from perfmodel.errors import UnknownNameError
        from perfmodel.predictor.placed import PlacementPredictor

        with self._promote_lock:
            try:
                ref = self.registry.get(version).ref
            except UnknownNameError as exc:
                raise NotFound(str(exc)) from None
            except Exception as exc:  # an unreadable manifest anywhere in the registry
                raise self._refused(version, exc) from None
            try:
                loaded = PlacementPredictor.load(self.settings.models_dir, ref)
                self.registry.promote(ref)
            except Exception as exc:  # any failure to load: refused, the old model keeps serving
                raise self._refused(ref, exc) from None
            previous = self.predictor.model_versions
            self.predictor = loaded
            self.generation += 1
            self._promoted_seen = self._promoted_refs()
            self.metrics.set_models(loaded.model_versions)
            self.store.add_model_event("promoted", ref)
            log.info("promoted %s: now serving %s", ref, loaded.model_versions)
            return {"promoted": ref, "serving": loaded.model_versions, "previous": previous}

    def _refused(self, ref: str, exc: Exception) -> ModelRefused:
        reason = f"{type(exc).__name__}: {exc}" if not isinstance(exc, PerfmodelError) else str(exc)
        reason = " ".join(reason.split())[:1000]
        self.store.add_model_event("refused", ref, reason)
        log.warning("refused to promote %s: %s", ref, reason)
        return ModelRefused(f"model {ref} was not promoted, its artifact does not load ({reason}); still serving "
                           f"{', '.join(self.predictor.model_versions.values())}")

    # --- keeping up with other workers ----------------------------------------------------------------------------

    def sync_once(self) -> None:
        """Pick up what other processes wrote: new observations, deleted jobs, promotions. Blocking."""
        for record in self.store.observations(after_id=self._last_observation_id):
            self._last_observation_id = max(self._last_observation_id, record.id)
            entry = self.cached(record.job_key)
            if entry is not None and entry.registered:
                with self._lock:
                    if all(o.id != record.id for o in entry.observations):
                        entry.observations.append(record)
                        entry.factors_generation = -1
        keys = self.store.job_keys()
        with self._lock:
            for key in [k for k, e in self._entries.items() if e.registered and k not in keys]:
                del self._entries[key]
        promoted = self._promoted_refs()
        if promoted != self._promoted_seen:
            from perfmodel.predictor.placed import PlacementPredictor

            with self._promote_lock:
                try:
                    loaded = PlacementPredictor.load(self.settings.models_dir)
                except Exception as exc:
                    log.warning("the registry's promoted models changed but do not load (%s): still serving %s",
                                exc, self.predictor.model_versions)
                else:
                    self.predictor = loaded
                    self.generation += 1
                    self.metrics.set_models(loaded.model_versions)
                    log.info("now serving %s (promoted elsewhere)", loaded.model_versions)
                self._promoted_seen = promoted

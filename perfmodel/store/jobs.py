"""The service's records in the store (schema v3): registered jobs, the throughputs running jobs observed, and
model promotions. `JobStore` is a `ProfileStore` that also holds these; each write is one transaction.

A job's public id is its `JobSpec.key()`: the same spec registered twice is one job, in any worker and after any
restart. Its graph IR is kept with it (JSON text), so a worker that never saw the job answers without a capture.
"""

from __future__ import annotations

import builtins  # `JobStore.list` (from ProfileStore) shadows `list` inside the class
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import CursorResult, Table, delete, func, insert, select
from sqlalchemy.exc import IntegrityError

from perfmodel.core.errors import PerfmodelError
from perfmodel.jobs.spec import JobSpec
from perfmodel.records import utc_now
from perfmodel.store.schema import write_transaction
from perfmodel.store.store import ProfileStore
from perfmodel.store.tables import JobRow, ModelEventRow, ObservationRow

_JOBS: Table = JobRow.__table__  # type: ignore[assignment]
_OBSERVATIONS: Table = ObservationRow.__table__  # type: ignore[assignment]
_EVENTS: Table = ModelEventRow.__table__  # type: ignore[assignment]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class JobRecord(_Record):
    """A registered job. `graph_json` (the IR as JSON text) is only read when asked for."""

    key: str = Field(description="JobSpec.key(): the job's id")
    name: str
    spec: JobSpec
    created_at: datetime
    graph_json: str | None = None


class ObservationRecord(_Record):
    id: int
    job_id: str
    accelerator: str = Field(description="catalog name of the placement's accelerator")
    devices: int
    placement: dict[str, Any] = Field(description="the PlacementSpec, as JSON")
    throughput_samples_per_s: float = Field(description="what the job measured")
    predicted_throughput_samples_per_s: float = Field(description="what was predicted for it then, uncalibrated")
    model_version: str = Field(description="the model(s) that predicted it")
    created_at: datetime
    colocated_with: str | None = Field(default=None, description="the job that shared the placement's GPUs while "
                                                                 "this one measured (its key); None: alone")
    sharing: str | None = Field(default=None, description="how the two shared them: time-slicing or mps")


# what a model event records: a model promoted, or a promotion refused
ModelAction = Literal["promoted", "refused"]


class ModelEvent(_Record):
    id: int
    action: ModelAction
    model_version: str
    detail: str | None = None
    created_at: datetime


_JOB_COLUMNS = (_JOBS.c.key, _JOBS.c.name, _JOBS.c.spec_json, _JOBS.c.created_at)
_OBSERVATION_COLUMNS = [c for c in _OBSERVATIONS.c if c.name not in ("job_id", "placement_json")]


def _new_id(result: CursorResult[Any]) -> int:
    """The primary key an INSERT gave its row."""
    key = result.inserted_primary_key
    if key is None:
        raise PerfmodelError("the store returned no id for the inserted row")
    return int(key[0])


def _observation(row: Any) -> ObservationRecord:
    values = dict(row)
    values["placement"] = values.pop("placement_json")
    return ObservationRecord.model_validate(values)


class JobStore(ProfileStore):
    """A profile store that also keeps the service's jobs, observations and model events."""

    # --- jobs ---

    def add_job(self, spec: JobSpec, graph_json: str | None = None) -> tuple[JobRecord, bool]:
        """Register `spec` (with its graph IR); returns the job and whether it is new. A spec the store already has
        is returned as stored, unchanged."""
        key = spec.key()
        try:
            with write_transaction(self.engine) as connection:
                found = connection.execute(select(*_JOB_COLUMNS).where(_JOBS.c.key == key)).mappings().first()
                if found is not None:
                    return self._job(found), False
                created_at = utc_now()
                connection.execute(insert(_JOBS).values(key=key, name=spec.name, source_kind=spec.source.kind,
                                                        spec_json=spec.model_dump(mode="json"),
                                                        graph_json=graph_json, created_at=created_at))
        except IntegrityError:  # another writer (a PostgreSQL transaction) registered it meanwhile
            stored = self.get_job(key)
            if stored is None:
                raise
            return stored, False
        return JobRecord(key=key, name=spec.name, spec=spec, created_at=created_at, graph_json=graph_json), True

    def get_job(self, key: str, *, with_graph: bool = False) -> JobRecord | None:
        columns = list(_JOB_COLUMNS)
        if with_graph:
            columns.append(_JOBS.c.graph_json)
        with self.engine.connect() as connection:
            row = connection.execute(select(*columns).where(_JOBS.c.key == key)).mappings().first()
        return None if row is None else self._job(row)

    def jobs(self) -> builtins.list[JobRecord]:
        """Every registered job (without its graph), oldest first."""
        query = select(*_JOB_COLUMNS).order_by(_JOBS.c.id)
        with self.engine.connect() as connection:
            return [self._job(row) for row in connection.execute(query).mappings()]

    def job_ids(self) -> set[str]:
        with self.engine.connect() as connection:
            return set(connection.scalars(select(_JOBS.c.key)))

    def delete_job(self, key: str) -> bool:
        """Remove a job, its observations and the other jobs' reports made while sharing GPUs with it (what they
        are against needs it), in one transaction; False if there was no such job."""
        with write_transaction(self.engine) as connection:
            job_row = connection.scalar(select(_JOBS.c.id).where(_JOBS.c.key == key))
            if job_row is None:
                return False
            connection.execute(delete(_OBSERVATIONS).where((_OBSERVATIONS.c.job_id == job_row)
                                                           | (_OBSERVATIONS.c.colocated_with == key)))
            connection.execute(delete(_JOBS).where(_JOBS.c.id == job_row))
            return True

    @staticmethod
    def _job(row: Any) -> JobRecord:
        return JobRecord(key=row["key"], name=row["name"], spec=JobSpec.model_validate(row["spec_json"]),
                         created_at=row["created_at"], graph_json=row.get("graph_json"))

    # --- observations ---

    def add_observation(self, key: str, *, placement: dict[str, Any], accelerator: str, devices: int,
                        throughput_samples_per_s: float, predicted_throughput_samples_per_s: float,
                        model_version: str, colocated_with: str | None = None,
                        sharing: str | None = None) -> ObservationRecord:
        """Store what job `key` measured on `placement` (while sharing its GPUs with job `colocated_with` in
        `sharing` mode, when given); PerfmodelError if no such job."""
        if (colocated_with is None) != (sharing is None):
            raise PerfmodelError("colocated_with and sharing are given together or not at all")
        for name, value in (("throughput_samples_per_s", throughput_samples_per_s),
                            ("predicted_throughput_samples_per_s", predicted_throughput_samples_per_s)):
            if not value > 0 or value == float("inf"):
                raise PerfmodelError(f"{name} must be a positive finite number, got {value!r}")
        created_at = utc_now()
        with write_transaction(self.engine) as connection:
            job_row = connection.scalar(select(_JOBS.c.id).where(_JOBS.c.key == key))
            if job_row is None:
                raise PerfmodelError(f"no job {key!r} in the store")
            observation_id = _new_id(connection.execute(insert(_OBSERVATIONS).values(
                job_id=job_row,  # column observations.job_id: the jobs table's row id
                accelerator=accelerator, devices=devices, placement_json=placement,
                throughput_samples_per_s=throughput_samples_per_s,
                predicted_throughput_samples_per_s=predicted_throughput_samples_per_s, model_version=model_version,
                created_at=created_at, colocated_with=colocated_with, sharing=sharing)))
        return ObservationRecord(id=observation_id, job_id=key, accelerator=accelerator, devices=devices,
                                 placement=placement, throughput_samples_per_s=throughput_samples_per_s,
                                 predicted_throughput_samples_per_s=predicted_throughput_samples_per_s,
                                 model_version=model_version, created_at=created_at, colocated_with=colocated_with,
                                 sharing=sharing)

    def observations(self, key: str | None = None, *, after_id: int = 0) -> builtins.list[ObservationRecord]:
        """Observations (of job `key`, or of every job) with an id above `after_id`, oldest first."""
        query = (select(*_OBSERVATION_COLUMNS, _OBSERVATIONS.c.placement_json, _JOBS.c.key.label("job_id"))
                 .join_from(_OBSERVATIONS, _JOBS).where(_OBSERVATIONS.c.id > after_id).order_by(_OBSERVATIONS.c.id))
        if key is not None:
            query = query.where(_JOBS.c.key == key)
        with self.engine.connect() as connection:
            return [_observation(row) for row in connection.execute(query).mappings()]

    def observation(self, observation_id: int) -> ObservationRecord | None:
        """One observation by id; None if there is none."""
        query = (select(*_OBSERVATION_COLUMNS, _OBSERVATIONS.c.placement_json, _JOBS.c.key.label("job_id"))
                 .join_from(_OBSERVATIONS, _JOBS).where(_OBSERVATIONS.c.id == observation_id))
        with self.engine.connect() as connection:
            row = connection.execute(query).mappings().first()
        return None if row is None else _observation(row)

    def delete_observation(self, observation_id: int) -> ObservationRecord | None:
        """Delete one observation (one transaction); the deleted record, or None if there was none."""
        record = self.observation(observation_id)
        if record is None:
            return None
        with write_transaction(self.engine) as connection:
            deleted = connection.execute(delete(_OBSERVATIONS).where(_OBSERVATIONS.c.id == observation_id)).rowcount
        return record if deleted else None

    def observation_ids(self, keys: Iterable[str]) -> dict[str, set[int]]:
        """{job key: ids of its observations} for the given jobs (how a worker sees deletions made elsewhere)."""
        keys = builtins.list(keys)
        out: dict[str, set[int]] = {key: set() for key in keys}
        if not keys:
            return out
        query = (select(_OBSERVATIONS.c.id, _JOBS.c.key).join_from(_OBSERVATIONS, _JOBS)
                 .where(_JOBS.c.key.in_(keys)))
        with self.engine.connect() as connection:
            for observation_id, key in connection.execute(query):
                out[key].add(observation_id)
        return out

    def observed_job_ids(self) -> builtins.list[str]:
        """Keys of the jobs with at least one observation, in the order they were registered."""
        query = (select(_JOBS.c.key).join_from(_JOBS, _OBSERVATIONS).group_by(_JOBS.c.id, _JOBS.c.key)
                 .order_by(_JOBS.c.id))
        with self.engine.connect() as connection:
            return builtins.list(connection.scalars(query))

    def last_observation_id(self) -> int:
        with self.engine.connect() as connection:
            return connection.scalar(select(func.max(_OBSERVATIONS.c.id))) or 0

    # --- model events ---

    def add_model_event(self, action: ModelAction, model_version: str,
                        detail: str | None = None) -> ModelEvent:
        created_at = utc_now()
        with write_transaction(self.engine) as connection:
            event_id = _new_id(connection.execute(insert(_EVENTS).values(
                action=action, model_version=model_version, detail=detail, created_at=created_at,
            )))
        return ModelEvent(id=event_id, action=action, model_version=model_version, detail=detail,
                          created_at=created_at)

    def model_events(self, limit: int | None = None) -> builtins.list[ModelEvent]:
        """Model events, newest first."""
        query = select(_EVENTS).order_by(_EVENTS.c.id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self.engine.connect() as connection:
            return [ModelEvent.model_validate(dict(row)) for row in connection.execute(query).mappings()]

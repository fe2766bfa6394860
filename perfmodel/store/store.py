"""The profile store: every profiling run, kept in SQLite by default or any SQLAlchemy database by setting."""

from __future__ import annotations

import builtins  # `ProfileStore.list` shadows `list` inside the class
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from pydantic import BaseModel, ConfigDict
from sqlalchemy import (
    JSON,
    Connection,
    Insert,
    Select,
    Table,
    Text,
    bindparam,
    cast,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph
from perfmodel.jobs.spec import JobSpec, Mode, Precision
from perfmodel.profilers.external import SHAPE_FIELDS, OpMeasurement
from perfmodel.records import Outcome, Profile, utc_now
from perfmodel.settings import Settings
from perfmodel.store import parquet
from perfmodel.store.rows import (
    ONNX_FIELDS,
    OP_FIELDS,
    WholeJobRecord,
    decode_json_columns,
    measurement_values,
    onnx_values,
    op_values,
    profile_values,
    to_profile,
    whole_job_values,
)
from perfmodel.store.schema import ensure_schema, open_engine, safe_url, write_transaction
from perfmodel.store.tables import (
    GraphRow,
    OnnxNodeRow,
    OpMeasurementRow,
    OpRecordRow,
    ProfileRow,
    WholeJobMeasurementRow,
)

if TYPE_CHECKING:
    import pandas as pd
    from typing_extensions import Self  # typing.Self from Python 3.11

# op and ONNX rows are inserted this many per statement
INSERT_CHUNK_ROWS = 5_000
# imported op measurements are checked for duplicates and inserted this many at a time (SQLite allows 32766
# bound parameters per statement since 3.32: the duplicate check binds one per row)
MEASUREMENT_CHUNK_ROWS = 2_000

_PROFILES: Table = ProfileRow.__table__  # type: ignore[assignment]
_OPS: Table = OpRecordRow.__table__  # type: ignore[assignment]
_NODES: Table = OnnxNodeRow.__table__  # type: ignore[assignment]
_MEASUREMENTS: Table = OpMeasurementRow.__table__  # type: ignore[assignment]
_GRAPHS: Table = GraphRow.__table__  # type: ignore[assignment]
_WHOLE_JOBS: Table = WholeJobMeasurementRow.__table__  # type: ignore[assignment]

# a job key (`JobSpec.key()`) is at most this long: the width of profiles.job_key and graphs.job_key
JOB_KEY_CHARS = 64

# a filter on a text column: one value, or any of several
Match = str | Sequence[str] | None


class ProfileSummary(BaseModel):
    """One line of `ProfileStore.list`: what a run was and how fast it went."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int
    job_name: str
    job_id: str  # column profiles.job_key
    family: str
    device_name: str
    batch_size: int
    seq_len: int
    precision: Precision
    mode: Mode
    outcome: Outcome | None  # None: the run has no iteration stats
    iter_time_ms_median: float | None
    throughput_samples_per_s: float | None
    coverage: float | None  # op-profile coverage, None without an op profile
    created_at: datetime


# outcomes that count as done for a resumable sweep
_DONE_OUTCOMES = (Outcome.ok.value, Outcome.oom.value)

_SUMMARY_COLUMNS = [
    *(_PROFILES.c[name] for name in ProfileSummary.model_fields if name not in ("coverage", "job_id")),
    _PROFILES.c.job_key.label("job_id"),
    _PROFILES.c.ops_coverage.label("coverage"),
]


def _filtered(query: Select[Any], **matches: Match) -> Select[Any]:
    for name, match in matches.items():
        if match is None:
            continue
        column = _MEASUREMENTS.c[name]
        query = query.where(column == match if isinstance(match, str) else column.in_(list(match)))
    return query


def _insert_new(connection: Connection, table: Table, unique: str | tuple[str, ...] = "uid") -> Insert:
    """An INSERT that skips rows whose `unique` column value (or values: a tuple of columns) is taken (one a
    concurrent writer just added), where the database has INSERT ... ON CONFLICT DO NOTHING; a plain INSERT
    elsewhere."""
    columns = [unique] if isinstance(unique, str) else list(unique)
    if connection.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table).on_conflict_do_nothing(index_elements=columns)
    if connection.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as postgresql_insert

        return postgresql_insert(table).on_conflict_do_nothing(index_elements=columns)
    return insert(table)


@dataclass(frozen=True)
class WholeJobImport:
    """What `ProfileStore.add_whole_job_measurements` did, by (source, source_id) of the runs given."""

    added: tuple[tuple[str, str], ...]  # new in the store
    present: tuple[tuple[str, str], ...]  # already stored (or given twice): the stored row is kept
    accelerators_filled: int  # of those, stored without an accelerator and given one now


def _check_graph_json(job_key: str, text: str) -> None:
    if not isinstance(job_key, str) or not 0 < len(job_key) <= JOB_KEY_CHARS:
        raise PerfmodelError(f"a graph's job key must be 1 to {JOB_KEY_CHARS} characters, got {job_key!r}")
    if not isinstance(text, str) or not text:
        raise PerfmodelError(f"the graph of job {job_key} is empty")


def _chunks(rows: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    it = iter(rows)
    while chunk := list(islice(it, size)):
        yield chunk


def _records(connection: Connection, table: Table, fields: Sequence[str], profile_id: int) -> list[dict[str, Any]]:
    """A run's rows of an op or ONNX table, in position order, as dicts of `fields`. JSON columns are read as text
    and decoded in one parse per column (`decode_json_columns`): reading the 205,551 op rows of 54 corpus runs took
    5.1 s through SQLAlchemy's per-row JSON processing and row mappings, and takes 2.4 s this way (most of it
    validating the records)."""
    json_fields = [name for name in fields if isinstance(table.c[name].type, JSON)]
    columns = [cast(table.c[name], Text) if name in json_fields else table.c[name] for name in fields]
    query = select(*columns).where(table.c.profile_id == profile_id).order_by(table.c.position)
    records = [dict(zip(fields, row)) for row in connection.execute(query)]
    decode_json_columns(records, json_fields, f"{table.name} of profile {profile_id}")
    return records


class ProfileStore:
    """Profiles in a database. Each `add` is one transaction: a run is stored whole or not at all."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url or Settings().resolved_store_url()
        self.engine = open_engine(self.url)
        try:
            ensure_schema(self.engine)
        except DBAPIError as exc:
            self.engine.dispose()
            raise PerfmodelError(f"cannot open profile store {safe_url(self.url)}: {exc.orig}") from exc
        except BaseException:
            self.engine.dispose()
            raise
        self._session = sessionmaker(self.engine, expire_on_commit=False)

    # --- writing ---

    def add(self, profile: Profile) -> int:
        """Store one run (a new row even if the job was profiled before); returns its id."""
        return self._insert(profile, uuid4().hex)

    def add_once(self, profile: Profile, uid: str) -> tuple[int, bool]:
        """Store one run under a caller-chosen `uid` (e.g. run id + job key) in one transaction, unless the store
        already has that uid: (its id, whether it was added). A retried task that wrote before it died adds nothing."""
        existing = self._id_of_uid(uid)
        if existing is not None:
            return existing, False
        try:
            return self._insert(profile, uid), True
        except IntegrityError:  # a concurrent attempt got there first
            existing = self._id_of_uid(uid)
            if existing is None:
                raise
            return existing, False

    def _id_of_uid(self, uid: str) -> int | None:
        with self.engine.connect() as connection:
            return connection.scalar(select(_PROFILES.c.id).where(_PROFILES.c.uid == uid))

    def _insert(self, profile: Profile, uid: str) -> int:
        with self._session.begin() as session:
            row = ProfileRow(uid=uid, **profile_values(profile))
            session.add(row)
            session.flush()
            if profile.ops is not None:
                self._insert_children(session, _OPS, row.id, op_values(profile.ops))
            if profile.onnx is not None:
                self._insert_children(session, _NODES, row.id, onnx_values(profile.onnx))
            return row.id

    @staticmethod
    def _insert_children(session: Session, table: Table, profile_id: int, rows: Iterable[dict[str, Any]]) -> None:
        for chunk in _chunks(({"profile_id": profile_id, **row} for row in rows), INSERT_CHUNK_ROWS):
            session.execute(insert(table), chunk)

    # --- reading ---

    def has(self, job_id: str, device_name: str | None = None) -> bool:
        """Whether the job was run to an outcome (ok or oom), on `device_name` if given: sweeps skip those."""
        condition = (_PROFILES.c.job_key == job_id) & _PROFILES.c.outcome.in_(_DONE_OUTCOMES)
        if device_name is not None:
            condition &= _PROFILES.c.device_name == device_name
        with self.engine.connect() as connection:
            return bool(connection.scalar(select(exists().where(condition))))

    def list(
        self, job: str | None = None, device: str | None = None, limit: int | None = None
    ) -> builtins.list[ProfileSummary]:
        """Runs, newest first. `job`: a job name or key; `device`: a device (cpu, cuda:0) or part of its name."""
        query = select(*_SUMMARY_COLUMNS).order_by(_PROFILES.c.created_at.desc(), _PROFILES.c.id.desc())
        if job is not None:
            query = query.where(or_(_PROFILES.c.job_name == job, _PROFILES.c.job_key == job))
        if device is not None:
            query = query.where(
                or_(
                    _PROFILES.c.device == device,
                    func.lower(_PROFILES.c.device_name).contains(device.lower(), autoescape=True),
                )
            )
        if limit is not None:
            query = query.limit(limit)
        with self.engine.connect() as connection:
            return [ProfileSummary.model_validate(dict(row)) for row in connection.execute(query).mappings()]

    def get(self, profile_id: int) -> Profile:
        """The run stored under `profile_id`, exactly as it was added."""
        with self.engine.connect() as connection, connection.begin():  # one snapshot for the three reads
            row = connection.execute(select(_PROFILES).where(_PROFILES.c.id == profile_id)).mappings().first()
            if row is None:
                raise PerfmodelError(f"no profile with id {profile_id} in the store")
            ops = _records(connection, _OPS, OP_FIELDS, profile_id)
            nodes = _records(connection, _NODES, ONNX_FIELDS, profile_id)
            return to_profile(row, ops, nodes)

    def count(self) -> int:
        with self.engine.connect() as connection:
            return connection.scalar(select(func.count()).select_from(_PROFILES)) or 0

    # --- op measurements imported from public benchmarks (perfmodel.importers) ---

    def add_op_measurements(self, measurements: Iterable[OpMeasurement], *, replace: bool = False) -> int:
        """Store imported measurements in one transaction; returns how many were new. A measurement the store
        already has (same source, file, row, op and phase) is skipped, so importing a file again adds nothing.
        `replace`: first delete what the store holds from each (source, file) met, then add (after a mapping fix).
        """
        imported_at = utc_now()
        added = 0
        seen: set[str] = set()
        replaced: set[tuple[str, str]] = set()
        with write_transaction(self.engine) as connection:
            statement = _insert_new(connection, _MEASUREMENTS)
            rows = (measurement_values(m, imported_at) for m in measurements)
            for chunk in _chunks(rows, MEASUREMENT_CHUNK_ROWS):
                if replace:
                    for source, source_file in {(r["source"], r["source_file"]) for r in chunk} - replaced:
                        connection.execute(delete(_MEASUREMENTS).where(_MEASUREMENTS.c.source == source,
                                                                       _MEASUREMENTS.c.source_file == source_file))
                        replaced.add((source, source_file))
                uids = [r["uid"] for r in chunk]
                stored = set(connection.scalars(select(_MEASUREMENTS.c.uid).where(_MEASUREMENTS.c.uid.in_(uids))))
                new = []
                for row in chunk:
                    if row["uid"] not in stored and row["uid"] not in seen:
                        seen.add(row["uid"])
                        new.append(row)
                if new:
                    connection.execute(statement, new)
                    added += len(new)
        return added

    def op_measurements(self, device: Match = None, op_class: Match = None, source: Match = None,
                        dtype: Match = None, phase: Match = None, *, extra: bool = True) -> pd.DataFrame:
        """The stored measurements matching every filter given (a value or a list of values), in import order:
        one row each, one column per `OpMeasurement` field (shape columns as nullable Int64), plus `uid`.
        `extra=False` leaves out the `extra` column (decoding its JSON is most of the time on large reads)."""
        import pandas as pd

        columns = [c for c in _MEASUREMENTS.c if c.name != "id" and (extra or c.name != "extra")]
        query = _filtered(select(*columns), device=device, op_class=op_class, source=source, dtype=dtype,
                          phase=phase).order_by(_MEASUREMENTS.c.id)
        with self.engine.connect() as connection:
            result = connection.execute(query)
            # plain tuples: pandas would take a Row's `dtype` column for the dtype of an array
            frame = pd.DataFrame([tuple(row) for row in result], columns=list(result.keys()))
        return frame.astype({name: "Int64" for name in ("source_row", *SHAPE_FIELDS)})

    def count_op_measurements(self, device: Match = None, op_class: Match = None, source: Match = None,
                              dtype: Match = None, phase: Match = None) -> int:
        query = _filtered(select(func.count()).select_from(_MEASUREMENTS), device=device, op_class=op_class,
                          source=source, dtype=dtype, phase=phase)
        with self.engine.connect() as connection:
            return connection.scalar(query) or 0

    def op_measurement_counts(self, by: Sequence[str] = ("source", "device", "op_class"),
                              source: Match = None) -> builtins.list[tuple[Any, ...]]:
        """(values of the `by` columns..., count) of the stored measurements, sorted by those values."""
        keys = [_MEASUREMENTS.c[name] for name in by]
        query = _filtered(select(*keys, func.count()).group_by(*keys).order_by(*keys), source=source)
        with self.engine.connect() as connection:
            return [tuple(row) for row in connection.execute(query)]

    # --- whole training jobs measured by public benchmarks (perfmodel.importers, schema v6) ---

    def add_whole_job_measurements(self, records: Iterable[WholeJobRecord], *,
                                   replace: bool = False) -> WholeJobImport:
        """Store whole-job runs in one transaction: every record is checked before anything is written, and an
        error leaves the store as it was. A run the store already has (same source and source_id) is not added
        again; its stored row is kept, except that one stored without an accelerator takes the record's (the
        hardware catalog has learned the GPU since). `replace`: first delete every stored run of the sources met
        (after a change in how they are mapped)."""
        imported_at = utc_now()
        rows = [whole_job_values(record, imported_at) for record in records]
        table = _WHOLE_JOBS
        added: builtins.list[tuple[str, str]] = []
        present: builtins.list[tuple[str, str]] = []
        filled = 0
        fill = (update(table)
                .where(table.c.source == bindparam("key_source"), table.c.source_id == bindparam("key_id"),
                       table.c.accelerator.is_(None))
                .values(accelerator=bindparam("new_accelerator")))
        with write_transaction(self.engine) as connection:
            if replace:
                for source in sorted({row["source"] for row in rows}):
                    connection.execute(delete(table).where(table.c.source == source))
            statement = _insert_new(connection, table, unique=("source", "source_id"))
            seen: set[tuple[str, str]] = set()
            for chunk in _chunks(rows, MEASUREMENT_CHUNK_ROWS):
                query = select(table.c.source, table.c.source_id, table.c.accelerator).where(
                    table.c.source_id.in_([row["source_id"] for row in chunk]))
                stored = {(source, source_id): accelerator
                          for source, source_id, accelerator in connection.execute(query)}
                new, fills = [], []
                for row in chunk:
                    key = (row["source"], row["source_id"])
                    if key not in stored and key not in seen:
                        seen.add(key)
                        new.append(row)
                        added.append(key)
                        continue
                    present.append(key)
                    if key in stored and stored[key] is None and row["accelerator"] is not None:
                        stored[key] = row["accelerator"]
                        fills.append({"key_source": key[0], "key_id": key[1],
                                      "new_accelerator": row["accelerator"]})
                if new:
                    connection.execute(statement, new)
                if fills:
                    connection.execute(fill, fills)
                    filled += len(fills)
        return WholeJobImport(added=tuple(added), present=tuple(present), accelerators_filled=filled)

    def whole_job_measurements(self, source: Match = None, status: Match = None) -> pd.DataFrame:
        """The stored whole-job runs matching every filter given (a value or a list of values; status "ok" for the
        runs with a throughput), in import order: one row each, one column per table column but `id`
        (`throughput_items_per_s` NaN and `unit` missing for a failed run, `accelerator` missing where the catalog
        lacked the GPU, `extra` a dict)."""
        import pandas as pd

        table = _WHOLE_JOBS
        query = select(*(c for c in table.c if c.name != "id")).order_by(table.c.id)
        for name, match in (("source", source), ("status", status)):
            if match is not None:
                column = table.c[name]
                query = query.where(column == match if isinstance(match, str) else column.in_(builtins.list(match)))
        with self.engine.connect() as connection:
            result = connection.execute(query)
            frame = pd.DataFrame([tuple(row) for row in result], columns=builtins.list(result.keys()))
        return frame.astype({"devices": "int64", "nodes": "int64", "global_batch_size": "int64",
                             "batch_size": "float64", "throughput_items_per_s": "float64"})

    # --- graphs of profiled jobs (schema v5) ---

    def add_graph(self, job_key: str, graph: Graph) -> bool:
        """Store the graph IR of the job `job_key` (`JobSpec.key()`) unless the store has one: whether it was added.
        One transaction; when two writers race, the first graph stays and the other adds nothing."""
        if graph.job_id is not None and graph.job_id != job_key:
            raise PerfmodelError(f"the graph of job {graph.job_id} cannot be stored as the graph of job {job_key}")
        return self.add_graphs({job_key: graph.to_json()}) == 1

    def add_graphs(self, graphs_json: Mapping[str, str]) -> int:
        """Store graphs given as IR JSON by job key, those the store lacks, in one transaction; how many were added.
        The JSON is stored as given: callers check it (`Graph.from_json`) first."""
        for job_key, text in graphs_json.items():
            _check_graph_json(job_key, text)
        created_at = utc_now()
        added = 0
        try:
            with write_transaction(self.engine) as connection:
                statement = _insert_new(connection, _GRAPHS, unique="job_key")
                returning = connection.dialect.name in ("sqlite", "postgresql")  # a row only when inserted
                if returning:
                    statement = statement.returning(_GRAPHS.c.id)
                stored = set(self._graph_keys(connection, builtins.list(graphs_json)))
                for job_key, text in graphs_json.items():
                    if job_key in stored:
                        continue
                    result = connection.execute(statement, {"job_key": job_key, "graph_json": text,
                                                            "created_at": created_at})
                    added += len(result.all()) if returning else 1
        except IntegrityError:  # a database without ON CONFLICT, and a concurrent writer got there first
            known = self.graph_keys()
            return self.add_graphs({k: v for k, v in graphs_json.items() if k not in known})
        return added

    def graph(self, job_key: str) -> Graph | None:
        """The stored graph IR of the job `job_key`, or None when the store has none."""
        with self.engine.connect() as connection:
            text = connection.scalar(select(_GRAPHS.c.graph_json).where(_GRAPHS.c.job_key == job_key))
        if text is None:
            return None
        try:
            return Graph.from_json(text)
        except (ValueError, PerfmodelError) as exc:  # pydantic's ValidationError is a ValueError
            raise PerfmodelError(f"the stored graph of job {job_key} is not valid: {exc}") from None

    def graph_keys(self) -> builtins.set[str]:
        """The job keys the store has a graph for."""
        with self.engine.connect() as connection:
            return set(connection.scalars(select(_GRAPHS.c.job_key)))

    def graphs_json(self, job_keys: Iterable[str] | None = None) -> dict[str, str]:
        """The stored graphs as IR JSON by job key (those of `job_keys` when given), not parsed."""
        query = select(_GRAPHS.c.job_key, _GRAPHS.c.graph_json).order_by(_GRAPHS.c.job_key)
        if job_keys is not None:
            query = query.where(_GRAPHS.c.job_key.in_(builtins.list(job_keys)))
        with self.engine.connect() as connection:
            return {key: text for key, text in connection.execute(query)}

    def profiled_jobs(self, *, without_graph: bool = False) -> builtins.list[tuple[str, JobSpec]]:
        """(job key as stored, job spec) of each job the stored runs name, once each, in the order first profiled
        (only those the store has no graph for with `without_graph`)."""
        first = (select(_PROFILES.c.job_key, func.min(_PROFILES.c.id).label("first_id"))
                 .group_by(_PROFILES.c.job_key).subquery())
        query = (select(_PROFILES.c.job_key, _PROFILES.c.job_json)
                 .join(first, _PROFILES.c.id == first.c.first_id).order_by(_PROFILES.c.id))
        if without_graph:
            query = query.where(_PROFILES.c.job_key.not_in(select(_GRAPHS.c.job_key)))
        with self.engine.connect() as connection:
            rows = connection.execute(query).all()
        jobs = []
        for job_key, job_json in rows:
            try:
                jobs.append((job_key, JobSpec.model_validate(job_json)))
            except ValueError as exc:
                raise PerfmodelError(f"the stored job {job_key} is not a valid job spec: {exc}") from None
        return jobs

    @staticmethod
    def _graph_keys(connection: Connection, job_keys: builtins.list[str]) -> Iterator[str]:
        for start in range(0, len(job_keys), MEASUREMENT_CHUNK_ROWS):
            chunk = job_keys[start:start + MEASUREMENT_CHUNK_ROWS]
            yield from connection.scalars(select(_GRAPHS.c.job_key).where(_GRAPHS.c.job_key.in_(chunk)))

    # --- Parquet ---

    def export_parquet(self, directory: str | Path) -> dict[str, int]:
        """Write every run to `directory` (profiles, op_records, onnx_nodes .parquet, manifest.json) and the graphs of
        their jobs (graphs.parquet); row counts."""
        return parquet.export_tables(self.engine, Path(directory))

    def import_parquet(self, directory: str | Path) -> int:
        """Add the runs of an export this store lacks (by uid), one transaction each, after the graphs it lacks (by
        job key, one transaction); how many runs were added. The export's tables and graphs are read and checked
        before anything is written."""
        with self.engine.connect() as connection:
            known = set(connection.scalars(select(_PROFILES.c.uid)))
        profiles = parquet.read_profiles(Path(directory), skip=known)
        graphs = parquet.read_graphs(Path(directory))
        if graphs:
            self.add_graphs(graphs)  # skips the job keys the store has
        added = 0
        for uid, profile in profiles:
            try:
                self._insert(profile, uid)
            except IntegrityError:
                if self._has_uid(uid):  # a concurrent import got there first
                    continue
                raise
            added += 1
        return added

    def _has_uid(self, uid: str) -> bool:
        with self.engine.connect() as connection:
            return bool(connection.scalar(select(exists().where(_PROFILES.c.uid == uid))))

    # --- lifetime ---

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ProfileStore({safe_url(self.url)!r})"

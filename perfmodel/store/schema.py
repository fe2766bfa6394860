"""Opening a store database: the engine (SQLite pragmas, real transactions) and the schema version.

On open the tables are created if the database is empty and stamped with `STORE_SCHEMA_VERSION`; a store at an older
version is brought up to date by the steps in `MIGRATIONS`, all in one transaction; a store at a newer version than
this perfmodel knows is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Connection,
    Double,
    Engine,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from perfmodel.core.errors import PerfmodelError
from perfmodel.store.tables import Base, SchemaInfo, UTCDateTime

# v1: profiles, op_records, onnx_nodes. v2: + op_measurements (op timings imported from public GPU benchmarks).
# v3: + jobs, observations, model_events (the HTTP service's registered jobs and what they measured).
# v4: + accelerators (custom accelerators: users' spec sheets).
# v5: + graphs (the graph IR of each profiled job, by job key: training reads it instead of capturing again).
# v6: + whole_job_measurements (whole training jobs run by public benchmarks: throughput, or why they failed).
# v7: observations AUTOINCREMENT on SQLite (an observation id, public over HTTP, is never given twice).
# v8: observations.colocated_with, observations.sharing (what a job measured while sharing its GPUs with another).
STORE_SCHEMA_VERSION = 8

Migration = Callable[[Connection], None]


def _v1_to_v2(connection: Connection) -> None:
    """Add the `op_measurements` table. The table is spelled out as it was at v2 (not taken from tables.py), so
    this step keeps creating the v2 table whatever later versions change."""
    int_ = Integer
    big = BigInteger
    table = Table(
        "op_measurements",
        MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("uid", String(32), nullable=False, unique=True),
        Column("source", String(16), nullable=False),
        Column("source_file", Text, nullable=False),
        Column("source_row", Integer, nullable=False),
        Column("device", String(64), nullable=False),
        Column("op_class", String(32), nullable=False),
        Column("op_name", String(64), nullable=False),
        Column("dtype", String(16), nullable=False),
        Column("phase", String(16), nullable=False),
        *(Column(name, big) for name in ("batch", "m", "n", "k", "hidden")),
        *(Column(name, int_) for name in (
            "seq_len", "in_channels", "out_channels", "input_height", "input_width", "kernel_height",
            "kernel_width", "stride_height", "stride_width", "padding_height", "padding_width", "input_size",
            "kernel_size", "stride", "padding")),
        Column("message_bytes", big),
        *(Column(name, int_) for name in ("world_size", "nodes", "num_tokens", "tensor_parallel")),
        Column("latency_ms", Double, nullable=False),
        Column("extra", JSON(none_as_null=True), nullable=False),
        Column("imported_at", UTCDateTime, nullable=False),
        Index("ix_op_measurements_device_op_class", "device", "op_class"),
    )
    table.create(connection)


def _v2_to_v3(connection: Connection) -> None:
    """Add the service's `jobs`, `observations` and `model_events` tables, spelled out as they were at v3."""
    metadata = MetaData()
    Table(
        "jobs",
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("key", String(64), nullable=False, unique=True),
        Column("name", Text, nullable=False),
        Column("source_kind", String(32), nullable=False),
        Column("spec_json", JSON(none_as_null=True), nullable=False),
        Column("graph_json", Text),
        Column("created_at", UTCDateTime, nullable=False),
    )
    Table(
        "observations",
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True),
        Column("accelerator", String(64), nullable=False),
        Column("devices", Integer, nullable=False),
        Column("placement_json", JSON(none_as_null=True), nullable=False),
        Column("throughput_samples_per_s", Double, nullable=False),
        Column("predicted_throughput_samples_per_s", Double, nullable=False),
        Column("model_version", Text, nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
    )
    Table(
        "model_events",
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("action", String(16), nullable=False),
        Column("model_version", Text, nullable=False),
        Column("detail", Text),
        Column("created_at", UTCDateTime, nullable=False),
    )
    metadata.create_all(connection)


def _v3_to_v4(connection: Connection) -> None:
    """Add the `accelerators` table (custom accelerators), spelled out as it was at v4."""
    Table(
        "accelerators",
        MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("name", String(128), nullable=False, unique=True),
        Column("spec_json", JSON(none_as_null=True), nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
    ).create(connection)


def _v4_to_v5(connection: Connection) -> None:
    """Add the `graphs` table (the graph IR of profiled jobs, by job key), spelled out as it was at v5."""
    Table(
        "graphs",
        MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("job_key", String(64), nullable=False, unique=True),
        Column("graph_json", Text, nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
    ).create(connection)


def _v5_to_v6(connection: Connection) -> None:
    """Add the `whole_job_measurements` table (whole training jobs run by public benchmarks), spelled out as it was
    at v6."""
    Table(
        "whole_job_measurements",
        MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("source", String(16), nullable=False),
        Column("source_id", Text, nullable=False),
        Column("model", String(64), nullable=False),
        Column("gpu_name", Text, nullable=False),
        Column("accelerator", String(64)),
        Column("devices", Integer, nullable=False),
        Column("nodes", Integer, nullable=False),
        Column("precision", String(16), nullable=False),
        Column("source_precision", String(16), nullable=False),
        Column("batch_size", Double, nullable=False),
        Column("global_batch_size", BigInteger, nullable=False),
        Column("throughput_items_per_s", Double),
        Column("unit", String(32)),
        Column("status", Text, nullable=False),
        Column("extra", JSON(none_as_null=True), nullable=False),
        Column("imported_at", UTCDateTime, nullable=False),
        UniqueConstraint("source", "source_id", name="uq_whole_job_measurements_source_source_id"),
        Index("ix_whole_job_measurements_model_accelerator", "model", "accelerator"),
    ).create(connection)


def _v6_to_v7(connection: Connection) -> None:
    """Make `observations` AUTOINCREMENT on SQLite, so that a deleted observation's id (which clients hold: it is the
    public `observation_id`) never goes to a later one; a plain INTEGER PRIMARY KEY gives max(id) + 1, so the id of a
    deleted newest row came back. SQLite cannot change that in place: the table is rebuilt (SQLite's "making other
    kinds of table schema changes" recipe) with every row and its id, the foreign key to jobs and the index on job_id,
    spelled out as it is at v7. PostgreSQL needs nothing: a SERIAL column's sequence never gives an id twice."""
    if connection.dialect.name != "sqlite":
        return
    metadata = MetaData()
    Table("jobs", metadata, Column("id", Integer, primary_key=True))  # for the foreign key only: not created
    rebuilt = Table(
        "observations_v7",  # renamed to observations once the old table is dropped
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        Column("accelerator", String(64), nullable=False),
        Column("devices", Integer, nullable=False),
        Column("placement_json", JSON(none_as_null=True), nullable=False),
        Column("throughput_samples_per_s", Double, nullable=False),
        Column("predicted_throughput_samples_per_s", Double, nullable=False),
        Column("model_version", Text, nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
        sqlite_autoincrement=True,
    )
    rebuilt.create(connection)
    columns = ", ".join(column.name for column in rebuilt.columns)
    connection.execute(text(f"INSERT INTO observations_v7 ({columns}) SELECT {columns} FROM observations"))
    connection.execute(text("DROP TABLE observations"))  # and its index; no table references observations
    connection.execute(text("ALTER TABLE observations_v7 RENAME TO observations"))
    connection.execute(text("CREATE INDEX ix_observations_job_id ON observations (job_id)"))
    # the next id is above every id kept: copying the rows in recorded their highest id in sqlite_sequence (SQLite
    # keeps "the largest ROWID ever inserted" there), and the rename carried that entry over to `observations`


def _v7_to_v8(connection: Connection) -> None:
    """Add `observations.colocated_with` (the key of the job that shared the GPUs) and `observations.sharing`
    (`time-slicing` or `mps`), both NULL for the observations of a job alone, as every stored one is."""
    present = {column["name"] for column in inspect(connection).get_columns("observations")}
    for name, kind in (("colocated_with", "VARCHAR(64)"), ("sharing", "VARCHAR(16)")):
        if name not in present:  # a store made at v3-v6 on PostgreSQL from today's tables may hold them already
            connection.execute(text(f"ALTER TABLE observations ADD COLUMN {name} {kind}"))


# MIGRATIONS[v] upgrades a store from version v to v + 1. Add one step per schema change, never edit old ones.
MIGRATIONS: Mapping[int, Migration] = {
    1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5, 5: _v5_to_v6, 6: _v6_to_v7, 7: _v7_to_v8,
}

SQLITE_BUSY_TIMEOUT_MS = 30_000
# the PostgreSQL advisory lock that serialises schema creation and migration: two replicas starting on an empty
# database at once would otherwise both create the tables, and one fail
SCHEMA_LOCK_KEY = 0x7065_7266_6D6F_64  # "perfmod"
POSTGRES_CONNECT_TIMEOUT_S = 10  # a PostgreSQL server that does not answer: an error after this long, not a hang


def safe_url(url: str | URL) -> str:
    """The URL without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<invalid URL>"


def open_engine(url: str) -> Engine:
    """An engine for a store URL; for a SQLite file, its folder is created and WAL + foreign keys are enabled."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise PerfmodelError(f"not a valid store URL {url!r}: {exc}") from None
    is_sqlite = parsed.get_backend_name() == "sqlite"
    if is_sqlite and parsed.database and parsed.database != ":memory:" and not parsed.database.startswith("file:"):
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {}
    if not is_sqlite:
        # a pooled connection is pinged before use: one the server dropped (a restart, a failover) is replaced, not
        # handed to a request that would fail on it
        options["pool_pre_ping"] = True
    try:
        if parsed.get_driver_name() in ("psycopg", "psycopg2") and "connect_timeout" not in parsed.query:
            options["connect_args"] = {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S}  # libpq's: wait forever
        engine = create_engine(parsed, **options)
    except (NoSuchModuleError, ModuleNotFoundError) as exc:
        raise PerfmodelError(f"cannot open store {safe_url(parsed)}: its database driver is missing ({exc})") from None
    if is_sqlite:
        _configure_sqlite(engine)
    return engine


def _configure_sqlite(engine: Engine) -> None:
    # pysqlite's own transaction handling skips BEGIN before DDL and SELECT; let SQLAlchemy emit BEGIN itself so
    # every transaction (including schema creation and migrations) is real. See the SQLAlchemy SQLite dialect docs,
    # "Serializable isolation / Savepoints / Transactional DDL".
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # a writer that reads first must hold the write lock from the start, or SQLite may refuse its upgrade
        immediate = connection.get_execution_options().get("sqlite_begin_immediate", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that takes the write lock up front on SQLite (BEGIN IMMEDIATE); a plain one elsewhere."""
    with engine.connect() as connection:
        connection.execution_options(sqlite_begin_immediate=True)
        with connection.begin():
            yield connection


def stored_version(connection: Connection) -> int | None:
    """The schema version a database records, or None for a database without perfmodel tables."""
    tables = set(inspect(connection).get_table_names())
    if SchemaInfo.__tablename__ not in tables:
        if tables & set(Base.metadata.tables):
            raise PerfmodelError("the database has perfmodel tables but no schema_info: not a perfmodel store")
        return None
    version = connection.scalar(select(SchemaInfo.version).where(SchemaInfo.id == 1))
    if version is None:
        raise PerfmodelError("the store's schema_info table has no version row")
    return version


def ensure_schema(
    engine: Engine, *, target: int = STORE_SCHEMA_VERSION, migrations: Mapping[int, Migration] = MIGRATIONS
) -> int | None:
    """Create or upgrade the schema to `target`; returns the version found (None for a new store)."""
    with engine.connect() as connection:  # the common case: already current, no write lock needed
        found = stored_version(connection)
    if found == target:
        return found
    with write_transaction(engine) as connection:
        if connection.dialect.name == "postgresql":  # SQLite's BEGIN IMMEDIATE locks; here, a lock held until commit
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
        found = stored_version(connection)  # again, now that no one else can be creating or migrating it
        if found is None:
            Base.metadata.create_all(connection)
            connection.execute(insert(SchemaInfo).values(id=1, version=target))
            return None
        if found > target:
            raise PerfmodelError(
                f"store schema v{found} is newer than this perfmodel supports (v{target}); upgrade perfmodel"
            )
        for version in range(found, target):
            step = migrations.get(version)
            if step is None:
                raise RuntimeError(f"perfmodel bug: no migration from store schema v{version} to v{version + 1}")
            step(connection)
        connection.execute(update(SchemaInfo).where(SchemaInfo.id == 1).values(version=target))
        return found

"""The schema is created and versioned on open; older stores are migrated, newer ones refused."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest
import torch
from sqlalchemy import insert, inspect, select, text
from sqlalchemy.exc import IntegrityError

from perfmodel.core.errors import PerfmodelError
from perfmodel.store import STORE_SCHEMA_VERSION, ProfileStore
from perfmodel.store.schema import ensure_schema
from perfmodel.store.tables import SchemaInfo


def _version(store: ProfileStore) -> int:
    with store.engine.connect() as connection:
        return connection.scalar(select(SchemaInfo.version))


def _database_path(sqlite_url: str) -> str:
    return sqlite_url.removeprefix("sqlite:///")


def test_a_new_store_has_every_table_and_the_current_version(store):
    assert set(inspect(store.engine).get_table_names()) >= {"schema_info", "profiles", "op_records", "onnx_nodes",
                                                             "op_measurements", "jobs", "observations",
                                                             "model_events", "accelerators", "graphs",
                                                             "whole_job_measurements"}
    assert _version(store) == STORE_SCHEMA_VERSION == 8
    with store.engine.connect() as connection:
        assert connection.execute(select(SchemaInfo.id, SchemaInfo.version)).all() == [(1, STORE_SCHEMA_VERSION)]
    with ProfileStore(store.url) as reopened:  # opening again changes nothing
        assert _version(reopened) == STORE_SCHEMA_VERSION


def test_sqlite_uses_wal_and_enforces_foreign_keys(sqlite_url):
    with ProfileStore(sqlite_url) as store:
        with store.engine.connect() as connection:
            assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
        with pytest.raises(IntegrityError), store.engine.begin() as connection:
            connection.execute(text(
                "INSERT INTO op_records (profile_id, position, seq, phase, name, kind, input_shapes, self_time_ms) "
                "VALUES (999, 0, 0, 'forward', 'aten::add', 'elementwise', '[]', 0.1)"
            ))


def test_a_newer_store_is_refused(sqlite_url):
    ProfileStore(sqlite_url).close()
    with closing(sqlite3.connect(_database_path(sqlite_url))) as db, db:
        db.execute("UPDATE schema_info SET version = ?", (STORE_SCHEMA_VERSION + 1,))
    with pytest.raises(PerfmodelError, match=f"store schema v{STORE_SCHEMA_VERSION + 1} is newer than this "
                                             "perfmodel supports"):
        ProfileStore(sqlite_url)


def test_an_older_store_is_migrated_step_by_step(sqlite_url, factory):
    with ProfileStore(sqlite_url) as store:
        profile = factory.profile()
        profile_id = store.add(profile)
    ran = []
    v = STORE_SCHEMA_VERSION

    def add_notes(connection):  # what a v -> v + 1 step would look like
        ran.append(1)
        connection.execute(text("ALTER TABLE profiles ADD COLUMN notes TEXT DEFAULT ''"))

    def index_notes(connection):
        ran.append(2)
        connection.execute(text("CREATE INDEX ix_profiles_notes ON profiles (notes)"))

    steps = {v: add_notes, v + 1: index_notes}
    with ProfileStore(sqlite_url) as store:
        found = ensure_schema(store.engine, target=v + 2, migrations=steps)
        assert found == v and ran == [1, 2] and _version(store) == v + 2
        assert "notes" in {c["name"] for c in inspect(store.engine).get_columns("profiles")}
        assert ensure_schema(store.engine, target=v + 2, migrations=steps) == v + 2
        assert ran == [1, 2]  # already current: no step runs again
        assert store.get(profile_id) == profile  # data survives the migration


def test_a_failed_migration_leaves_the_store_untouched(sqlite_url):
    ProfileStore(sqlite_url).close()

    def half_done(connection):
        connection.execute(text("ALTER TABLE profiles ADD COLUMN notes TEXT"))
        raise RuntimeError("step crashed")

    v = STORE_SCHEMA_VERSION
    with ProfileStore(sqlite_url) as store:
        with pytest.raises(RuntimeError, match="step crashed"):
            ensure_schema(store.engine, target=v + 1, migrations={v: half_done})
        assert _version(store) == v
        assert "notes" not in {c["name"] for c in inspect(store.engine).get_columns("profiles")}  # DDL rolled back


def test_a_missing_migration_step_is_a_bug(sqlite_url):
    v = STORE_SCHEMA_VERSION
    with ProfileStore(sqlite_url) as store:
        with pytest.raises(RuntimeError, match=f"no migration from store schema v{v} to v{v + 1}"):
            ensure_schema(store.engine, target=v + 1, migrations={})
        assert _version(store) == v


def test_a_database_with_foreign_tables_of_our_names_is_refused(sqlite_url, tmp_path):
    path = tmp_path / "foreign.db"
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE profiles (id INTEGER PRIMARY KEY, whatever TEXT)")
    with pytest.raises(PerfmodelError, match="no schema_info"):
        ProfileStore(f"sqlite:///{path}")


def test_the_tables_compile_for_postgresql():
    """Without a server: the DDL SQLAlchemy would emit for PostgreSQL is valid for every table and type."""
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.schema import CreateTable

    from perfmodel.store.tables import Base

    ddl = "\n".join(str(CreateTable(t).compile(dialect=postgresql.dialect())) for t in Base.metadata.sorted_tables)
    assert "DOUBLE PRECISION" in ddl and "BIGINT" in ddl and "JSON" in ddl
    assert "REFERENCES profiles (id) ON DELETE CASCADE" in ddl


V1_TABLES = ("schema_info", "profiles", "op_records", "onnx_nodes")


def _make_v1_store(url: str, profile) -> int:
    """A store as perfmodel v1 wrote it (every table but op_measurements, stamped v1), holding one profile."""
    from perfmodel.store.rows import op_values, profile_values
    from perfmodel.store.schema import open_engine, write_transaction
    from perfmodel.store.tables import Base, OpRecordRow, ProfileRow

    engine = open_engine(url)
    try:
        with write_transaction(engine) as connection:
            v1_tables = [t for t in Base.metadata.sorted_tables if t.name in V1_TABLES]
            Base.metadata.create_all(connection, tables=v1_tables)
            connection.execute(insert(SchemaInfo).values(id=1, version=1))
            profile_id = connection.execute(
                insert(ProfileRow.__table__).values(uid="0" * 32, **profile_values(profile))
            ).inserted_primary_key[0]
            connection.execute(insert(OpRecordRow.__table__),
                               [{"profile_id": profile_id, **row} for row in op_values(profile.ops)])
        return profile_id
    finally:
        engine.dispose()


def _assert_columns_as_declared(store: ProfileStore, inspector, table: str) -> None:
    """The migration's frozen table has the columns (names, order, nullability, types) a new store gets."""
    from perfmodel.store.tables import Base

    expected = Base.metadata.tables[table]
    dialect = store.engine.dialect
    columns = inspector.get_columns(table)
    assert [c["name"] for c in columns] == [c.name for c in expected.columns]
    for found, want in zip(columns, expected.columns):
        assert found["nullable"] == want.nullable, want.name
        assert found["type"].compile(dialect=dialect) == want.type.compile(dialect=dialect), want.name


def test_a_v1_store_is_migrated_to_the_current_version_with_an_op_measurements_table(store_url, factory):
    from perfmodel.profilers.external import OpMeasurement

    profile = factory.profile(n_ops=15)
    profile_id = _make_v1_store(store_url, profile)
    with ProfileStore(store_url) as store:
        assert _version(store) == STORE_SCHEMA_VERSION
        inspector = inspect(store.engine)
        assert "op_measurements" in inspector.get_table_names()
        _assert_columns_as_declared(store, inspector, "op_measurements")
        indexes = {i["name"]: i["column_names"] for i in inspector.get_indexes("op_measurements")}
        assert indexes.get("ix_op_measurements_device_op_class") == ["device", "op_class"]
        unique = [u["column_names"] for u in inspector.get_unique_constraints("op_measurements")] + \
            [i["column_names"] for i in inspector.get_indexes("op_measurements") if i.get("unique")]
        assert ["uid"] in unique
        assert store.get(profile_id) == profile  # the v1 data survives
        record = OpMeasurement(source="neusight", source_file="a.csv", source_row=0, device="t4", op_class="bmm",
                               op_name="bmm", dtype="fp32", phase="forward", batch=1, m=2, n=3, k=4, latency_ms=0.5)
        assert store.add_op_measurements([record]) == 1
    with ProfileStore(store_url) as reopened:  # opening again changes nothing
        assert _version(reopened) == STORE_SCHEMA_VERSION and reopened.count_op_measurements() == 1


def test_a_v4_store_is_migrated_to_v5_with_a_graphs_table(store_url, factory):
    """The v4 -> v5 step adds the `graphs` table, as a new store has it; the runs stay and graphs can be stored."""
    from perfmodel.graph.from_torch import graph_from_module
    from perfmodel.store.rows import profile_values
    from perfmodel.store.schema import open_engine, write_transaction
    from perfmodel.store.tables import Base, ProfileRow

    profile = factory.profile(n_ops=None)
    engine = open_engine(store_url)
    try:
        with write_transaction(engine) as connection:
            later = ("graphs", "whole_job_measurements")  # v5 and v6 tables
            Base.metadata.create_all(connection, tables=[t for t in Base.metadata.sorted_tables if t.name not in later])
            connection.execute(insert(SchemaInfo).values(id=1, version=4))
            profile_id = connection.execute(
                insert(ProfileRow.__table__).values(uid="0" * 32, **profile_values(profile))
            ).inserted_primary_key[0]
    finally:
        engine.dispose()
    with ProfileStore(store_url) as store:
        assert _version(store) == STORE_SCHEMA_VERSION
        inspector = inspect(store.engine)
        _assert_columns_as_declared(store, inspector, "graphs")
        unique = [u["column_names"] for u in inspector.get_unique_constraints("graphs")] + \
            [i["column_names"] for i in inspector.get_indexes("graphs") if i.get("unique")]
        assert ["job_key"] in unique
        assert store.get(profile_id) == profile  # the v4 data survives
        assert store.profiled_jobs(without_graph=True) == [(profile.job_id, profile.job)]
        module = torch.nn.Linear(4, 2).to("meta")
        graph = graph_from_module(module, (torch.empty(1, 4, device="meta"),), name="lin", job_id=profile.job_id)
        assert store.add_graph(profile.job_id, graph) and store.graph(profile.job_id) == graph


def test_a_v5_store_is_migrated_to_v6_with_a_whole_job_measurements_table(store_url, factory):
    """The v5 -> v6 step adds `whole_job_measurements` as a new store has it (columns, unique key, index); the runs
    and graphs stay, and whole-job runs can be stored."""
    from datetime import datetime

    from perfmodel.importers.lambda_runs import WholeJobRun
    from perfmodel.jobs.spec import Precision
    from perfmodel.store.rows import profile_values
    from perfmodel.store.schema import open_engine, write_transaction
    from perfmodel.store.tables import Base, GraphRow, ProfileRow

    profile = factory.profile(n_ops=None)
    engine = open_engine(store_url)
    try:
        with write_transaction(engine) as connection:
            v5 = [t for t in Base.metadata.sorted_tables if t.name != "whole_job_measurements"]
            Base.metadata.create_all(connection, tables=v5)
            connection.execute(insert(SchemaInfo).values(id=1, version=5))
            profile_id = connection.execute(
                insert(ProfileRow.__table__).values(uid="0" * 32, **profile_values(profile))
            ).inserted_primary_key[0]
            connection.execute(insert(GraphRow.__table__).values(job_key=profile.job_id, graph_json="{}",
                                                                 created_at=profile.created_at))
    finally:
        engine.dispose()
    with ProfileStore(store_url) as store:
        assert _version(store) == STORE_SCHEMA_VERSION == 8
        inspector = inspect(store.engine)
        _assert_columns_as_declared(store, inspector, "whole_job_measurements")
        unique = [u["column_names"] for u in inspector.get_unique_constraints("whole_job_measurements")] + \
            [i["column_names"] for i in inspector.get_indexes("whole_job_measurements") if i.get("unique")]
        assert ["source", "source_id"] in unique
        indexes = {i["name"]: i["column_names"] for i in inspector.get_indexes("whole_job_measurements")}
        assert indexes.get("ix_whole_job_measurements_model_accelerator") == ["model", "accelerator"]
        assert store.get(profile_id) == profile and store.graphs_json() == {profile.job_id: "{}"}  # v5 data stays
        run = WholeJobRun(
            source="lambda", source_id="pytorch/results/A40/PyTorch_gnmt_FP16/x.txt", suite="v0", config="A40",
            host=None, variant=None, gpu_name="A40", arch="Ampere", accelerator="a40", devices=1, nodes=1,
            source_model="gnmt", model="gnmt", source_precision="FP16", amp_in_log=True, precision=Precision.amp,
            batch_size=256.0, global_batch_size=256, batch_source="log", throughput=97000.5, unit="tokens/s",
            metric="gnmt_epoch_train_tok_s", status="ok", date=datetime(2021, 6, 1, 12, 0), pytorch_version=None,
            cuda_version=None)
        assert store.add_whole_job_measurements([run]).added == (("lambda", run.source_id),)
    with ProfileStore(store_url) as reopened:  # opening again changes nothing
        assert _version(reopened) == STORE_SCHEMA_VERSION
        stored = reopened.whole_job_measurements()
        assert stored[["model", "accelerator", "throughput_items_per_s"]].values.tolist() == [["gnmt", "a40", 97000.5]]


def test_a_v7_store_is_migrated_to_v8_with_the_colocation_columns_of_observations(sqlite_url):
    """The v7 -> v8 step adds `observations.colocated_with` and `.sharing` as a new store has them; a stored
    observation stays (alone: both None), and observations of a job sharing its GPUs can be stored."""
    from perfmodel.jobs.spec import JobSpec, ZooSource
    from perfmodel.store.jobs import JobStore

    spec, other = (JobSpec(source=ZooSource(name=name), batch_size=8) for name in ("resnet18", "resnet50"))
    placement = {"accelerator": "t4", "devices_per_node": [1], "global_batch_size": 8}
    values = {"placement": placement, "accelerator": "t4", "devices": 1, "throughput_samples_per_s": 100.0,
              "predicted_throughput_samples_per_s": 120.0, "model_version": "m/v1"}
    with JobStore(sqlite_url) as store:
        key = store.add_job(spec)[0].key
        partner = store.add_job(other)[0].key
        before = store.add_observation(key, **values)
        with store.engine.begin() as connection:  # the store as v7 had it
            connection.execute(text("ALTER TABLE observations DROP COLUMN sharing"))
            connection.execute(text("ALTER TABLE observations DROP COLUMN colocated_with"))
            connection.execute(text("UPDATE schema_info SET version = 7"))
    with JobStore(sqlite_url) as store:
        assert _version(store) == STORE_SCHEMA_VERSION == 8
        _assert_columns_as_declared(store, inspect(store.engine), "observations")
        assert store.observations(key) == [before] and before.colocated_with is None and before.sharing is None
        shared = store.add_observation(key, **values, colocated_with=partner, sharing="time-slicing")
        assert store.observation(shared.id) == shared
        assert (shared.colocated_with, shared.sharing) == (partner, "time-slicing")
        with pytest.raises(PerfmodelError, match="together"):
            store.add_observation(key, **values, colocated_with=partner)

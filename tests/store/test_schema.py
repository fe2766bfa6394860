"""The schema is created and versioned on open; older stores are migrated, newer ones refused."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest
from sqlalchemy import inspect, select, text
from sqlalchemy.exc import IntegrityError

from perfmodel.errors import PerfmodelError
from perfmodel.store import STORE_SCHEMA_VERSION, ProfileStore
from perfmodel.store.schema import ensure_schema
from perfmodel.store.tables import SchemaInfo


def _version(store: ProfileStore) -> int:
    with store.engine.connect() as connection:
        return connection.scalar(select(SchemaInfo.version))


def _database_path(sqlite_url: str) -> str:
    return sqlite_url.removeprefix("sqlite:///")


def test_a_new_store_has_every_table_and_the_current_version(store):
    assert set(inspect(store.engine).get_table_names()) >= {"schema_info", "profiles", "op_records", "onnx_nodes"}
    assert _version(store) == STORE_SCHEMA_VERSION == 1
    with store.engine.connect() as connection:
        assert connection.execute(select(SchemaInfo.id, SchemaInfo.version)).all() == [(1, 1)]
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

    def add_notes(connection):  # what a v1 -> v2 step would look like
        ran.append(1)
        connection.execute(text("ALTER TABLE profiles ADD COLUMN notes TEXT DEFAULT ''"))

    def index_notes(connection):
        ran.append(2)
        connection.execute(text("CREATE INDEX ix_profiles_notes ON profiles (notes)"))

    with ProfileStore(sqlite_url) as store:
        found = ensure_schema(store.engine, target=3, migrations={1: add_notes, 2: index_notes})
        assert found == 1 and ran == [1, 2] and _version(store) == 3
        assert "notes" in {c["name"] for c in inspect(store.engine).get_columns("profiles")}
        assert ensure_schema(store.engine, target=3, migrations={1: add_notes, 2: index_notes}) == 3
        assert ran == [1, 2]  # already current: no step runs again
        assert store.get(profile_id) == profile  # data survives the migration


def test_a_failed_migration_leaves_the_store_untouched(sqlite_url):
    ProfileStore(sqlite_url).close()

    def half_done(connection):
        connection.execute(text("ALTER TABLE profiles ADD COLUMN notes TEXT"))
        raise RuntimeError("step crashed")

    with ProfileStore(sqlite_url) as store:
        with pytest.raises(RuntimeError, match="step crashed"):
            ensure_schema(store.engine, target=2, migrations={1: half_done})
        assert _version(store) == 1
        assert "notes" not in {c["name"] for c in inspect(store.engine).get_columns("profiles")}  # DDL rolled back


def test_a_missing_migration_step_is_a_bug(sqlite_url):
    with ProfileStore(sqlite_url) as store:
        with pytest.raises(RuntimeError, match="no migration from store schema v1 to v2"):
            ensure_schema(store.engine, target=2, migrations={})
        assert _version(store) == 1


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

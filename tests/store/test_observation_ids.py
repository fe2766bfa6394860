"""Observation ids are public (`POST /v1/observations` returns one; GET and DELETE take it), so none is ever given
twice: not after the newest observation is deleted (SQLite's plain INTEGER PRIMARY KEY reused max(id) + 1 until
schema v7 made the table AUTOINCREMENT), and not in a store upgraded from v6. On SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import Engine, Table, delete, insert, inspect, select, text

from perfmodel.records import utc_now
from perfmodel.store import STORE_SCHEMA_VERSION
from perfmodel.store.jobs import JobStore
from perfmodel.store.schema import ensure_schema, open_engine, write_transaction
from perfmodel.store.tables import Base, JobRow, ObservationRow, SchemaInfo
from tests.store.test_jobs import PLACEMENT, SPEC, _observe

OTHER = SPEC.model_copy(update={"batch_size": 16})
V1_TABLES = ("schema_info", "profiles", "op_records", "onnx_nodes")
_JOBS: Table = JobRow.__table__  # type: ignore[assignment]
_OBSERVATIONS: Table = ObservationRow.__table__  # type: ignore[assignment]



def test_a_deleted_observation_id_is_never_given_again(store_url):
    with JobStore(store_url) as store:
        key = store.add_job(SPEC)[0].key
        first, second = _observe(store, key, 90.0), _observe(store, key, 110.0)
        assert (first.id, second.id) == (1, 2)
        assert store.delete_observation(second.id) == second
        third = _observe(store, key, 130.0)
        assert third.id == 3  # not 2: a client holding 2 gets 404, not someone else's report
        assert store.observation(2) is None and store.delete_observation(2) is None
        assert store.observation(3) == third and [o.id for o in store.observations(key)] == [1, 3]
        for observation in store.observations():  # every row gone, then the next: still above all ids given
            store.delete_observation(observation.id)
        assert _observe(store, key).id == 4
        assert store.delete_job(key)  # a job deleted and registered again: its observations' ids go on too
        key = store.add_job(SPEC)[0].key
        assert _observe(store, key).id == 5


def _v6_engine(url: str) -> Engine:
    """An engine on a store built as perfmodel v6 left it: the v1 tables, then the real migrations up to v6 only
    (their frozen tables: `observations` as v3 created it)."""
    engine = open_engine(url)
    with write_transaction(engine) as connection:
        Base.metadata.create_all(connection, tables=[t for t in Base.metadata.sorted_tables if t.name in V1_TABLES])
        connection.execute(insert(SchemaInfo).values(id=1, version=1))
    assert ensure_schema(engine, target=6) == 1
    return engine


def _insert_observation(engine: Engine, job_row: int, throughput: float) -> int:
    with write_transaction(engine) as connection:
        return connection.execute(insert(_OBSERVATIONS).values(
            job_id=job_row, accelerator="t4", devices=1, placement_json=PLACEMENT,
            throughput_samples_per_s=throughput, predicted_throughput_samples_per_s=120.0,
            model_version="xgb-device-ops/v1", created_at=utc_now(),
        )).inserted_primary_key[0]


def _delete_observation(engine: Engine, observation_id: int) -> None:
    with write_transaction(engine) as connection:
        assert connection.execute(delete(_OBSERVATIONS).where(_OBSERVATIONS.c.id == observation_id)).rowcount == 1


V8_COLUMNS = ("colocated_with", "sharing")  # added after v7 (None for every row stored before)


def _rows(engine: Engine) -> list[dict]:
    """Every observation row, in the columns it had at v6 and v7."""
    columns = [c for c in _OBSERVATIONS.c if c.name not in V8_COLUMNS]
    with engine.connect() as connection:
        return [dict(row) for row in connection.execute(select(*columns).order_by(_OBSERVATIONS.c.id)).mappings()]


def test_a_v6_store_keeps_its_observations_and_ids_and_never_reuses_one_after_the_upgrade(store_url):
    engine = _v6_engine(store_url)
    try:
        sqlite = engine.dialect.name == "sqlite"
        with write_transaction(engine) as connection:
            job_rows = [connection.execute(insert(_JOBS).values(
                key=spec.key(), name=spec.name, source_kind=spec.source.kind, spec_json=spec.model_dump(mode="json"),
                graph_json=None, created_at=utc_now())).inserted_primary_key[0] for spec in (SPEC, OTHER)]
        assert [_insert_observation(engine, job_rows[i % 2], 100.0 + i) for i in range(4)] == [1, 2, 3, 4]
        _delete_observation(engine, 2)  # a gap
        _delete_observation(engine, 4)
        reused = _insert_observation(engine, job_rows[0], 200.0)
        assert reused == (4 if sqlite else 5)  # the v6 bug, on SQLite only: this is the table v6 made
        before = _rows(engine)
        assert [row["id"] for row in before] == [1, 3, reused]
    finally:
        engine.dispose()

    with JobStore(store_url) as store:
        with store.engine.connect() as connection:
            assert connection.scalar(select(SchemaInfo.version)) == STORE_SCHEMA_VERSION == 8
        assert _rows(store.engine) == before  # every row, with its id and values
        assert [o.id for o in store.observations(SPEC.key())] == [1, 3, reused]
        assert {(o.colocated_with, o.sharing) for o in store.observations(SPEC.key())} == {(None, None)}
        assert [o.id for o in store.observations(OTHER.key())] == []
        inspector = inspect(store.engine)
        columns = inspector.get_columns("observations")
        assert [c["name"] for c in columns] == [c.name for c in _OBSERVATIONS.columns]
        assert [c["nullable"] for c in columns] == [c.nullable for c in _OBSERVATIONS.columns]
        indexes = {i["name"]: i["column_names"] for i in inspector.get_indexes("observations")}
        assert indexes.get("ix_observations_job_id") == ["job_id"]
        [foreign_key] = inspector.get_foreign_keys("observations")
        assert foreign_key["referred_table"] == "jobs" and foreign_key["constrained_columns"] == ["job_id"]
        assert foreign_key["referred_columns"] == ["id"] and foreign_key["options"].get("ondelete") == "CASCADE"
        if sqlite:
            with store.engine.connect() as connection:
                ddl = connection.scalar(text("SELECT sql FROM sqlite_master WHERE name = 'observations'"))
                assert "AUTOINCREMENT" in ddl
                assert connection.scalar(text("SELECT seq FROM sqlite_sequence WHERE name = 'observations'")) == reused
                assert "observations_v7" not in inspect(connection).get_table_names()

        assert store.delete_observation(reused) is not None  # the newest, deleted after the upgrade
        after = _observe(store, SPEC.key())
        assert after.id == reused + 1
        assert store.delete_observation(after.id) is not None
        assert _observe(store, OTHER.key()).id == reused + 2
        assert store.observation(reused) is None and store.observation(after.id) is None

        with write_transaction(store.engine) as connection:  # the foreign key still cascades
            connection.execute(delete(_JOBS).where(_JOBS.c.key == SPEC.key()))
        assert [o.id for o in store.observations()] == [reused + 2]

    with JobStore(store_url) as reopened:  # opening again changes nothing
        assert [o.id for o in reopened.observations()] == [reused + 2]
        assert _observe(reopened, OTHER.key()).id == reused + 3


def test_a_v6_store_without_observations_starts_at_one_and_never_reuses(store_url):
    _v6_engine(store_url).dispose()
    with JobStore(store_url) as store:
        key = store.add_job(SPEC)[0].key
        first = _observe(store, key)
        assert first.id == 1
        store.delete_observation(first.id)
        assert _observe(store, key).id == 2

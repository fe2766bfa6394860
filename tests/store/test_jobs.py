"""The service's tables (schema v3): jobs, observations, model events; on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import insert, inspect, select

from perfmodel.core.errors import PerfmodelError
from perfmodel.jobs.spec import JobSpec, ZooSource
from perfmodel.store import STORE_SCHEMA_VERSION
from perfmodel.store.jobs import JobStore
from perfmodel.store.schema import open_engine, write_transaction
from perfmodel.store.tables import Base, ObservationRow, SchemaInfo

SPEC = JobSpec(source=ZooSource(name="resnet18"), batch_size=8)
PLACEMENT = {"accelerator": "t4", "devices_per_node": [1], "global_batch_size": 8}


def _observe(store: JobStore, key: str, throughput: float = 100.0):
    return store.add_observation(key, placement=PLACEMENT, accelerator="t4", devices=1,
                                 throughput_samples_per_s=throughput, predicted_throughput_samples_per_s=120.0,
                                 model_version="xgb-device-ops/v1")


def test_jobs_are_stored_once_with_their_graph(store_url):
    with JobStore(store_url) as store:
        job, created = store.add_job(SPEC, '{"graph": 1}')
        assert created and job.key == SPEC.key() and job.name == "resnet18"
        again, created = store.add_job(SPEC, '{"graph": 2}')
        assert not created and again.key == job.key
        stored = store.get_job(job.key, with_graph=True)
        assert stored.spec == SPEC and stored.graph_json == '{"graph": 1}'  # the first registration stands
        assert store.get_job(job.key).graph_json is None  # the graph is only read when asked for
        assert [j.key for j in store.jobs()] == [job.key] and store.job_ids() == {job.key}
        assert store.get_job("0" * 24) is None


def test_observations_belong_to_a_job_and_go_with_it(store_url):
    with JobStore(store_url) as store:
        key = store.add_job(SPEC)[0].key
        other = store.add_job(SPEC.model_copy(update={"batch_size": 16}))[0].key
        first, second = _observe(store, key, 90.0), _observe(store, key, 110.0)
        _observe(store, other)
        assert [o.throughput_samples_per_s for o in store.observations(key)] == [90.0, 110.0]
        assert store.observations(key)[0].placement == PLACEMENT
        assert [o.id for o in store.observations(after_id=first.id)] == [second.id, second.id + 1]
        assert store.last_observation_id() == second.id + 1
        with pytest.raises(PerfmodelError, match="no job"):
            _observe(store, "f" * 24)
        with pytest.raises(PerfmodelError, match="positive finite"):
            _observe(store, key, float("nan"))
        assert store.delete_job(key) and not store.delete_job(key)
        assert store.observations(key) == [] and len(store.observations()) == 1
        with store.engine.connect() as connection:  # no orphan rows
            assert connection.scalar(select(ObservationRow.job_id).distinct()) is not None
            assert len(connection.execute(select(ObservationRow.id)).all()) == 1


def test_a_failed_observation_write_leaves_nothing(store_url, monkeypatch):
    with JobStore(store_url) as store:
        key = store.add_job(SPEC)[0].key
        import perfmodel.store.jobs as jobs_module

        def broken_now():
            raise RuntimeError("crash between the job look-up and the insert")

        monkeypatch.setattr(jobs_module, "utc_now", broken_now)
        with pytest.raises(RuntimeError):
            _observe(store, key)
        monkeypatch.undo()
        assert store.observations() == [] and store.job_ids() == {key}


def test_model_events_newest_first(store_url):
    with JobStore(store_url) as store:
        store.add_model_event("refused", "xgb-ops/v2", "model.json is not an XGBoost model")
        store.add_model_event("promoted", "xgb-ops/v3")
        events = store.model_events()
        assert [(e.action, e.model_version) for e in events] == [("promoted", "xgb-ops/v3"), ("refused", "xgb-ops/v2")]
        assert events[1].detail.startswith("model.json") and store.model_events(limit=1)[0].action == "promoted"


def test_a_v2_store_is_migrated_to_v3_with_the_service_tables(store_url):
    engine = open_engine(store_url)
    try:
        with write_transaction(engine) as connection:
            later = ("jobs", "observations", "model_events", "accelerators", "graphs",  # v3, v4, v5 and v6 tables
                     "whole_job_measurements")
            v2 = [t for t in Base.metadata.sorted_tables if t.name not in later]
            Base.metadata.create_all(connection, tables=v2)
            connection.execute(insert(SchemaInfo).values(id=1, version=2))
    finally:
        engine.dispose()
    with JobStore(store_url) as store:
        inspector = inspect(store.engine)
        assert {"jobs", "observations", "model_events"} <= set(inspector.get_table_names())
        dialect = store.engine.dialect
        for name in ("jobs", "observations", "model_events"):  # the frozen v3 tables are those a new store gets
            expected = Base.metadata.tables[name]
            found = inspector.get_columns(name)
            assert [c["name"] for c in found] == [c.name for c in expected.columns]
            for column, want in zip(found, expected.columns):
                assert column["nullable"] == want.nullable, (name, want.name)
                assert column["type"].compile(dialect=dialect) == want.type.compile(dialect=dialect), want.name
        with store.engine.connect() as connection:
            assert connection.scalar(select(SchemaInfo.version)) == STORE_SCHEMA_VERSION
        key = store.add_job(SPEC)[0].key
        assert _observe(store, key).job_id == key


def test_one_observation_is_read_and_deleted_by_id(store_url):
    with JobStore(store_url) as store:
        key = store.add_job(SPEC)[0].key
        first, second = _observe(store, key, 100.0), _observe(store, key, 90.0)
        assert store.observation(first.id) == first and store.observation(10**9) is None
        assert store.observation_ids([key, "0" * 24]) == {key: {first.id, second.id}, "0" * 24: set()}
        assert store.delete_observation(first.id) == first
        assert store.delete_observation(first.id) is None  # gone, and only it
        assert [o.id for o in store.observations(key)] == [second.id]
        assert store.observation_ids([key]) == {key: {second.id}}

"""The store's custom accelerators (schema v4): added once, read back equal, a taken name with other figures is a
clash, and a v3 store is migrated to v4 with the table (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
from sqlalchemy import insert, inspect, select

from perfmodel.hardware.custom import AcceleratorClash, validate_spec_sheet
from perfmodel.store import STORE_SCHEMA_VERSION, ProfileStore
from perfmodel.store.accelerators import (
    add_accelerator,
    custom_accelerators,
    delete_accelerator,
    get_accelerator_record,
)
from perfmodel.store.schema import open_engine, write_transaction
from perfmodel.store.tables import Base, SchemaInfo

SPEC = validate_spec_sheet({"name": "acme-x1", "kind": "gpu", "peak_fp32_gflops": 60_000,
                            "memory_bandwidth_gb_s": 3000, "memory_gb": 96, "compute_units": 120})


def test_add_get_list_delete(store_url):
    with ProfileStore(store_url) as store:
        record, created = add_accelerator(store, SPEC)
        assert created and record.spec == SPEC
        assert add_accelerator(store, SPEC)[1] is False
        with pytest.raises(AcceleratorClash, match="other figures"):
            add_accelerator(store, SPEC.model_copy(update={"memory_gb": 192.0}))
    with ProfileStore(store_url) as reopened:  # another process on the store
        assert custom_accelerators(reopened) == [SPEC]
        assert get_accelerator_record(reopened, "acme-x1").spec == SPEC
        assert get_accelerator_record(reopened, "nope") is None
        assert delete_accelerator(reopened, "acme-x1") and not delete_accelerator(reopened, "acme-x1")
        assert custom_accelerators(reopened) == []


def test_a_v3_store_is_migrated_to_v4(store_url):
    engine = open_engine(store_url)
    try:
        with write_transaction(engine) as connection:
            later = ("accelerators", "graphs", "whole_job_measurements")  # v4, v5 and v6 tables
            v3 = [t for t in Base.metadata.sorted_tables if t.name not in later]
            Base.metadata.create_all(connection, tables=v3)
            connection.execute(insert(SchemaInfo).values(id=1, version=3))
    finally:
        engine.dispose()
    with ProfileStore(store_url) as store:
        assert "accelerators" in inspect(store.engine).get_table_names()
        with store.engine.connect() as connection:
            assert connection.scalar(select(SchemaInfo.version)) == STORE_SCHEMA_VERSION
        assert add_accelerator(store, SPEC)[1]

"""Parquet export/import: exact round trip between stores, idempotent import, broken exports are user errors."""

from __future__ import annotations

import json
from datetime import timedelta

import pyarrow.parquet as pq
import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.records import Outcome
from perfmodel.store import STORE_SCHEMA_VERSION, ProfileStore


def _all_profiles(store: ProfileStore) -> list:
    return [store.get(summary.id) for summary in reversed(store.list())]  # oldest first


@pytest.fixture
def source(tmp_path, factory):
    """A store with a varied set of runs: CPU and GPU, OOM, ONNX only, HF inference, and a repeated run."""
    t0 = factory.profile().created_at
    profiles = [
        factory.profile(n_ops=120, n_onnx=9, created_at=t0),
        factory.profile(name="vit_b_16", outcome=Outcome.oom, environment=factory.cuda_environment(),
                        created_at=t0 + timedelta(minutes=1)),
        factory.profile(name="squeezenet", outcome=None, n_ops=None, n_onnx=4, created_at=t0 + timedelta(minutes=2)),
        factory.hf_profile(),
        factory.profile(n_ops=0, created_at=t0 + timedelta(days=3)),
    ]
    with ProfileStore(f"sqlite:///{tmp_path / 'source' / 'perfmodel.db'}") as store:
        for profile in profiles:
            store.add(profile)
        yield store


def test_export_writes_three_tables_and_a_manifest(source, tmp_path):
    counts = source.export_parquet(tmp_path / "profiles")
    assert counts == {"profiles": 5, "op_records": 120 + 40 + 25, "onnx_nodes": 9 + 4 + 12}
    files = sorted(p.name for p in (tmp_path / "profiles").iterdir())
    assert files == ["manifest.json", "onnx_nodes.parquet", "op_records.parquet", "profiles.parquet"]
    manifest = json.loads((tmp_path / "profiles" / "manifest.json").read_text())
    assert manifest["schema_version"] == STORE_SCHEMA_VERSION
    assert manifest["row_counts"] == counts
    assert manifest["perfmodel_version"] and manifest["exported_at"]
    ops = pq.read_table(tmp_path / "profiles" / "op_records.parquet")
    assert "profile_uid" in ops.column_names and "profile_id" not in ops.column_names
    uids = pq.read_table(tmp_path / "profiles" / "profiles.parquet").column("uid").to_pylist()
    assert len(set(uids)) == 5 and set(ops.column("profile_uid").to_pylist()) <= set(uids)


def test_round_trip_into_another_store_is_exact(store, source, tmp_path):
    source.export_parquet(tmp_path / "export")
    assert store.import_parquet(tmp_path / "export") == 5
    assert _all_profiles(store) == _all_profiles(source)


def test_import_is_idempotent_and_adds_only_new_runs(store, source, tmp_path, factory):
    source.export_parquet(tmp_path / "export")
    assert store.import_parquet(tmp_path / "export") == 5
    assert store.import_parquet(tmp_path / "export") == 0
    assert source.import_parquet(tmp_path / "export") == 0  # the source already has every uid
    assert store.count() == 5

    newer = factory.profile(name="mobilenet_v3_small", created_at=factory.profile().created_at + timedelta(days=9))
    source.add(newer)
    store.add(factory.profile(name="local-only"))  # runs of the target store are kept, not shadowed
    source.export_parquet(tmp_path / "export")  # overwrite the export in place
    assert store.import_parquet(tmp_path / "export") == 1
    assert store.count() == 7
    assert store.get(store.list(job="mobilenet_v3_small")[0].id) == newer


def test_empty_store_exports_and_imports_nothing(sqlite_url, tmp_path):
    with ProfileStore(sqlite_url) as empty:
        assert empty.export_parquet(tmp_path / "e") == {"profiles": 0, "op_records": 0, "onnx_nodes": 0}
        assert empty.import_parquet(tmp_path / "e") == 0


def test_missing_folder_or_manifest_is_a_user_error(source, tmp_path):
    with pytest.raises(PerfmodelError, match="not a folder"):
        source.import_parquet(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PerfmodelError, match="no manifest.json"):
        source.import_parquet(tmp_path / "empty")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "op_records.parquet").write_bytes(b"PAR1 garbage"), "cannot read"),
        (lambda d: (d / "onnx_nodes.parquet").unlink(), "cannot read"),
        (lambda d: (d / "manifest.json").write_text("{not json"), "not readable JSON"),
        (lambda d: (d / "manifest.json").write_text('{"format": "csv"}'), "not a perfmodel profile export"),
        (lambda d: _edit_manifest(d, schema_version=STORE_SCHEMA_VERSION + 1), "newer than this perfmodel"),
        (lambda d: _edit_manifest(d, row_counts={"profiles": 5, "op_records": 1, "onnx_nodes": 25}),
         "has 185 rows but the manifest says 1"),
        (lambda d: pq.write_table(pq.read_table(d / "profiles.parquet").drop_columns(["job_json"]),
                                  d / "profiles.parquet"), "lacks the columns job_json"),
    ],
)
def test_a_damaged_export_is_a_user_error_and_imports_nothing(store, source, tmp_path, damage, message):
    source.export_parquet(tmp_path / "export")
    damage(tmp_path / "export")
    with pytest.raises(PerfmodelError, match=message):
        store.import_parquet(tmp_path / "export")
    assert store.count() == 0


def test_an_invalid_profile_in_an_export_is_a_user_error(store, source, tmp_path):
    source.export_parquet(tmp_path / "export")
    path = tmp_path / "export" / "profiles.parquet"
    table = pq.read_table(path)
    table = table.set_column(table.column_names.index("job_json"), "job_json",
                             [['{"source": {"kind": "zoo"}}'] * table.num_rows])
    pq.write_table(table, path)
    with pytest.raises(PerfmodelError, match="is not valid"):
        store.import_parquet(tmp_path / "export")


def _edit_manifest(directory, **changes) -> None:
    path = directory / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_exports_of_schema_v1_still_import(store, source, tmp_path):
    """v2 only added the op_measurements table, which exports leave out: a v1 export (as shipped under
    profiles/) holds the same three tables and imports as it is."""
    source.export_parquet(tmp_path / "export")
    _edit_manifest(tmp_path / "export", schema_version=1)
    assert store.import_parquet(tmp_path / "export") == 5
    assert _all_profiles(store) == _all_profiles(source)
    _edit_manifest(tmp_path / "export", schema_version=0)
    with pytest.raises(PerfmodelError, match=r"schema v0 \(only v1, v2, v3, v4\)"):
        store.import_parquet(tmp_path / "export")

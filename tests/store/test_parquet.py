"""Parquet export/import: exact round trip between stores, idempotent import, broken exports are user errors."""

from __future__ import annotations

import json
from datetime import timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.records import Outcome
from perfmodel.store import STORE_SCHEMA_VERSION, ProfileStore


def _all_profiles(store: ProfileStore) -> list:
    return [store.get(summary.id) for summary in reversed(store.list())]  # oldest first


@pytest.fixture
def source(tmp_path, factory, tiny_graph):
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
        for key in (profiles[0].job_id, profiles[3].job_id, ORPHAN_KEY):  # the last: a job with no run
            store.add_graph(key, tiny_graph.model_copy(update={"job_id": key}))
        yield store


ORPHAN_KEY = "f" * 64


@pytest.fixture(scope="module")
def tiny_graph():
    """A real graph IR (torch.export of a small MLP on the meta device), given to jobs with `model_copy`."""
    import torch

    from perfmodel.graph.from_torch import graph_from_module

    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("meta")
    return graph_from_module(module, (torch.empty(2, 8, device="meta"),), name="tiny")


def test_export_writes_three_tables_the_graphs_and_a_manifest(source, tmp_path):
    counts = source.export_parquet(tmp_path / "profiles")
    assert counts == {"profiles": 5, "op_records": 120 + 40 + 25, "onnx_nodes": 9 + 4 + 12, "graphs": 2}
    files = sorted(p.name for p in (tmp_path / "profiles").iterdir())
    assert files == ["graphs.parquet", "manifest.json", "onnx_nodes.parquet", "op_records.parquet",
                     "profiles.parquet"]
    graphs = pq.read_table(tmp_path / "profiles" / "graphs.parquet")
    assert graphs.column_names == ["job_key", "graph_json"]
    job_keys = set(pq.read_table(tmp_path / "profiles" / "profiles.parquet").column("job_key").to_pylist())
    assert set(graphs.column("job_key").to_pylist()) < job_keys  # only graphs of exported jobs, not the orphan
    assert dict(zip(*graphs.to_pydict().values())) == {k: v for k, v in source.graphs_json().items()
                                                       if k != ORPHAN_KEY}
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
    exported = {k: v for k, v in source.graphs_json().items() if k != ORPHAN_KEY}
    assert store.graphs_json() == exported and len(exported) == 2
    assert {key: store.graph(key) for key in exported} == {key: source.graph(key) for key in exported}


def test_import_adds_only_the_graphs_the_store_lacks(store, source, tmp_path, tiny_graph):
    source.export_parquet(tmp_path / "export")
    mine = tiny_graph.model_copy(update={"name": "mine", "job_id": source.profiled_jobs()[0][0]})
    store.add_graph(mine.job_id, mine)
    assert store.import_parquet(tmp_path / "export") == 5
    assert store.graph(mine.job_id) == mine  # kept, not replaced
    assert len(store.graph_keys()) == 2
    assert store.import_parquet(tmp_path / "export") == 0 and len(store.graph_keys()) == 2


def test_an_export_of_schema_v4_without_graphs_still_imports(store, source, tmp_path):
    source.export_parquet(tmp_path / "export")
    (tmp_path / "export" / "graphs.parquet").unlink()
    counts = json.loads((tmp_path / "export" / "manifest.json").read_text())["row_counts"]
    _edit_manifest(tmp_path / "export", schema_version=4, row_counts={k: v for k, v in counts.items() if k != "graphs"})
    assert store.import_parquet(tmp_path / "export") == 5
    assert _all_profiles(store) == _all_profiles(source) and store.graph_keys() == set()


@pytest.mark.parametrize("bad_json", ['{"nodes": [', '{"schema_version": 1, "name": "x"}', '{"schema_version": 9}'])
def test_a_graph_that_does_not_parse_is_refused_before_anything_is_written(store, source, tmp_path, bad_json):
    source.export_parquet(tmp_path / "export")
    path = tmp_path / "export" / "graphs.parquet"
    table = pq.read_table(path)
    job_key = table.column("job_key")[1].as_py()
    texts = table.column("graph_json").to_pylist()
    texts[1] = bad_json
    pq.write_table(table.set_column(1, "graph_json", pa.array(texts)), path)
    with pytest.raises(PerfmodelError, match=f"graph of job {job_key} in .*export is not valid"):
        store.import_parquet(tmp_path / "export")
    assert store.count() == 0 and store.graph_keys() == set()


def test_a_graph_filed_under_another_job_is_refused(store, source, tmp_path):
    source.export_parquet(tmp_path / "export")
    path = tmp_path / "export" / "graphs.parquet"
    table = pq.read_table(path)
    pq.write_table(table.set_column(0, "job_key", pa.array(list(reversed(table.column("job_key").to_pylist())))),
                   path)
    with pytest.raises(PerfmodelError, match="names job"):
        store.import_parquet(tmp_path / "export")
    assert store.count() == 0 and store.graph_keys() == set()


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
        assert empty.export_parquet(tmp_path / "e") == {"profiles": 0, "op_records": 0, "onnx_nodes": 0,
                                                        "graphs": 0}
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
        (lambda d: _edit_manifest(d, row_counts={"profiles": 5, "op_records": 1, "onnx_nodes": 25, "graphs": 2}),
         "has 185 rows but the manifest says 1"),
        (lambda d: _edit_manifest(d, row_counts={"profiles": 5, "op_records": 185, "onnx_nodes": 25}),
         "no row count for every table"),  # a v5 export must count its graphs
        (lambda d: (d / "graphs.parquet").unlink(), "cannot read"),  # and have them
        (lambda d: _edit_manifest(d, row_counts={"profiles": 5, "op_records": 185, "onnx_nodes": 25, "graphs": 3}),
         "has 2 rows but the manifest says 3"),
        (lambda d: pq.write_table(pq.read_table(d / "profiles.parquet").drop_columns(["job_json"]),
                                  d / "profiles.parquet"), "lacks the columns job_json"),
    ],
)
def test_a_damaged_export_is_a_user_error_and_imports_nothing(store, source, tmp_path, damage, message):
    source.export_parquet(tmp_path / "export")
    damage(tmp_path / "export")
    with pytest.raises(PerfmodelError, match=message):
        store.import_parquet(tmp_path / "export")
    assert store.count() == 0 and store.graph_keys() == set()


def test_an_invalid_profile_in_an_export_is_a_user_error(store, source, tmp_path):
    source.export_parquet(tmp_path / "export")
    path = tmp_path / "export" / "profiles.parquet"
    table = pq.read_table(path)
    table = table.set_column(table.column_names.index("job_json"), "job_json",
                             [['{"source": {"kind": "zoo"}}'] * table.num_rows])
    pq.write_table(table, path)
    with pytest.raises(PerfmodelError, match="is not valid"):
        store.import_parquet(tmp_path / "export")


@pytest.mark.parametrize("cell", ["[[1, 2]], [[3]]", "[[1, 2]", ""])
def test_an_op_cell_that_is_not_one_json_value_is_refused(store, source, tmp_path, cell):
    """A run's JSON cells are parsed together: a cell holding two values, half of one or none is still an error
    naming the run, and the run (here the first) is not imported."""
    source.export_parquet(tmp_path / "export")
    path = tmp_path / "export" / "op_records.parquet"
    table = pq.read_table(path)
    shapes = table.column("input_shapes").to_pylist()
    shapes[0] = cell
    table = table.set_column(table.column_names.index("input_shapes"), "input_shapes", [shapes])
    pq.write_table(table, path)
    with pytest.raises(PerfmodelError, match="is not valid"):
        store.import_parquet(tmp_path / "export")
    assert store.count() == 0


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
    with pytest.raises(PerfmodelError, match=r"schema v0 \(only v1, v2, v3, v4, v5, v6, v7, v8\)"):
        store.import_parquet(tmp_path / "export")

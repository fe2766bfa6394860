"""The shipped CPU corpus (profiles/cpu-corpus): a learned model trained on some families beats the analytic
roofline on a family it never saw (training runs only: 54 of its 162 runs). The graphs come with the export
(graphs.parquet), so nothing is captured; and a shipped graph is what capturing its job gives today."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from perfmodel.features.dataset import samples_from_store
from perfmodel.regressors.roofline import RooflineRegressor
from perfmodel.regressors.xgb_graph import XGBGraphRegressor
from perfmodel.store import ProfileStore

CORPUS = Path(__file__).resolve().parents[2] / "profiles" / "cpu-corpus"
TRAIN_FAMILIES = ("vit", "convnext", "mobilenet", "regnet", "mlp-mixer")
HELD_OUT = "resnet"


def _training_runs_of(families: set[str], directory: Path) -> Path:
    """The corpus's training runs of `families` as an export in `directory` (the same format, fewer rows): importing
    and capturing only what the test reads keeps it to a minute instead of several."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    profiles = pq.read_table(CORPUS / "profiles.parquet")
    keep = pc.and_(pc.is_in(profiles["family"], pa.array(sorted(families))), pc.equal(profiles["mode"], "train"))
    profiles = profiles.filter(keep)
    uids = profiles["uid"]
    counts = {"profiles": profiles.num_rows}
    pq.write_table(profiles, directory / "profiles.parquet")
    for name in ("op_records", "onnx_nodes"):
        table = pq.read_table(CORPUS / f"{name}.parquet")
        table = table.filter(pc.is_in(table["profile_uid"], uids))
        counts[name] = table.num_rows
        pq.write_table(table, directory / f"{name}.parquet")
    graphs = pq.read_table(CORPUS / "graphs.parquet")
    graphs = graphs.filter(pc.is_in(graphs["job_key"], profiles["job_key"]))
    counts["graphs"] = graphs.num_rows
    pq.write_table(graphs, directory / "graphs.parquet")
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    (directory / "manifest.json").write_text(json.dumps({**manifest, "row_counts": counts}))
    return directory


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    if not (CORPUS / "profiles.parquet").exists():
        pytest.skip(f"the shipped corpus is missing at {CORPUS}")
    url = f"sqlite:///{tmp_path_factory.mktemp('corpus') / 'store.db'}"
    export = _training_runs_of({*TRAIN_FAMILIES, HELD_OUT}, tmp_path_factory.mktemp("corpus-export"))
    graph_cache = tmp_path_factory.mktemp("graphs")
    with ProfileStore(url) as store:
        store.import_parquet(export)
        samples = samples_from_store(store, families={*TRAIN_FAMILIES, HELD_OUT}, graph_cache_dir=graph_cache)
    assert list(graph_cache.iterdir()) == []  # every graph came from the export: none was captured
    return samples


def test_a_shipped_graph_is_what_capturing_its_job_gives_today():
    """Guards the shipped graphs against drifting from the capture code (the ops were matched against them)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from perfmodel.core.ir import Graph
    from perfmodel.graph.from_torch import capture_graph
    from perfmodel.jobs.spec import JobSpec

    if not (CORPUS / "graphs.parquet").exists():
        pytest.skip(f"the shipped corpus is missing at {CORPUS}")
    profiles = pq.read_table(CORPUS / "profiles.parquet", columns=["job_name", "mode", "batch_size", "job_key",
                                                                   "job_json"])
    resnet18 = profiles.filter(pc.and_(pc.equal(profiles["job_name"], "resnet18"), pc.equal(profiles["mode"], "train")))
    row = resnet18.sort_by("batch_size").slice(0, 1).to_pylist()[0]
    graphs = pq.read_table(CORPUS / "graphs.parquet")
    [shipped_json] = graphs.filter(pc.equal(graphs["job_key"], row["job_key"]))["graph_json"].to_pylist()
    spec = JobSpec.model_validate_json(row["job_json"])
    assert spec.key() == row["job_key"]
    shipped, fresh = Graph.from_json(shipped_json), capture_graph(spec)
    # the shipped graphs were captured before captures measured the activations autograd saves and recorded their
    # batch (optional fields: the memory estimate falls back to its graph rule without them, the batch to the
    # inputs' leading dimension); everything else must be as captured today
    assert fresh.totals.saved_activation_bytes is not None and fresh.batch_size == spec.batch_size
    fresh = fresh.model_copy(update={"batch_size": None, "totals": fresh.totals.model_copy(
        update={"saved_activation_bytes": None, "saved_activation_bytes_amp": None})})
    assert [node.id for node in shipped.nodes] == [node.id for node in fresh.nodes]
    assert shipped.to_json() == fresh.to_json()


@pytest.mark.slow  # imports 54 runs with their op records (~20 s)
def test_a_learned_model_beats_roofline_on_a_family_it_never_saw(samples):
    train = [s for s in samples if s.family != HELD_OUT]
    held_out = [s for s in samples if s.family == HELD_OUT]
    assert {s.family for s in train} == set(TRAIN_FAMILIES)
    assert len(held_out) >= 15

    measured = np.asarray([s.iter_time_ms for s in held_out])
    learned = XGBGraphRegressor().fit(train).predict(held_out)
    roofline = RooflineRegressor().predict(held_out)
    learned_mape = float(np.mean(np.abs(learned.iter_time_ms - measured) / measured)) * 100
    roofline_mape = float(np.mean(np.abs(roofline.iter_time_ms - measured) / measured)) * 100
    assert learned_mape < roofline_mape, (
        f"held-out {HELD_OUT}: learned {learned_mape:.1f} %, roofline {roofline_mape:.1f} %")

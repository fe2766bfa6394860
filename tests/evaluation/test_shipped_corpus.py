"""The shipped CPU corpus (profiles/cpu-corpus): a learned model trained on some families beats the analytic
roofline on a family it never saw (training runs only: 54 of its 162 runs)."""

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
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    (directory / "manifest.json").write_text(json.dumps({**manifest, "row_counts": counts}))
    return directory


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    if not (CORPUS / "profiles.parquet").exists():
        pytest.skip(f"the shipped corpus is missing at {CORPUS}")
    url = f"sqlite:///{tmp_path_factory.mktemp('corpus') / 'store.db'}"
    export = _training_runs_of({*TRAIN_FAMILIES, HELD_OUT}, tmp_path_factory.mktemp("corpus-export"))
    with ProfileStore(url) as store:
        store.import_parquet(export)
        return samples_from_store(store, families={*TRAIN_FAMILIES, HELD_OUT},
                                  graph_cache_dir=tmp_path_factory.mktemp("graphs"))


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

"""Training runs behind `perfmodel train` and `train-ops`: fitted on real data, saved to a temporary registry,
promoted for their role when asked; empty data refused with a message saying what to do."""

from __future__ import annotations

import dataclasses
import functools
import json
from itertools import islice
from pathlib import Path

import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.engine.op_table import device_ops_model, promoted_device_ops_model
from perfmodel.evaluation.training import seeded, train_device_ops_model, train_iteration_model
from perfmodel.features.dataset import sample_for_prediction
from perfmodel.graph.from_torch import capture_graph
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.importers import ImportStats, get_importer
from perfmodel.jobs.spec import JobSpec
from perfmodel.registry.registry import DOMAIN_FILE, ModelRegistry
from perfmodel.regressors.roofline import RooflineRegressor
from perfmodel.regressors.xgb_ops import XGBOpsRegressor
from perfmodel.settings import get_settings
from perfmodel.store import ProfileStore

USER_MODELS = Path(__file__).parents[1] / "profilers" / "user_models.py"
HW = HardwareSpec(name="test-cpu", kind="cpu", peak_fp32_gflops=100.0, memory_bandwidth_gb_s=20.0, memory_gb=16.0,
                  compute_units=2, threads=2, source="test")
NEUSIGHT = get_settings().datasets_dir / "neusight"
GPUS = ("Tesla T4", "Tesla P4", "NVIDIA A100-PCIE-40GB")
FAST = {"n_estimators": 15, "calibration_rows": 200, "nthread": 1}


@pytest.fixture(scope="module")
def samples():
    """Measured samples of two real tiny graphs (measured = 30 x roofline)."""
    base = [sample_for_prediction(spec, HW, graph=capture_graph(spec))
            for spec in (JobSpec.from_options(module=f"{USER_MODELS}:{name}", batch_size=2)
                         for name in ("tiny_cnn", "tiny_mlp"))]
    roofline = RooflineRegressor().predict(base).iter_time_ms
    return [dataclasses.replace(s, family=f"f{i}", iter_time_ms=float(30 * r), profile_id=i)
            for i, (s, r) in enumerate(zip(base, roofline))]


def test_seeded_passes_the_seed_only_to_regressors_that_take_one():
    assert seeded(RooflineRegressor, 7) is RooflineRegressor
    factory = seeded(XGBOpsRegressor, 7)
    assert isinstance(factory, functools.partial) and factory.keywords == {"seed": 7}


def test_an_iteration_model_is_saved_and_promoted(samples, tmp_path):
    said = []
    entry = train_iteration_model("roofline", samples, name="base", promote=True, models_dir=tmp_path,
                                  progress=said.append)
    registry = ModelRegistry(tmp_path)
    assert entry.ref == "base/v1" and registry.promoted_ref("cpu-step") == "base/v1"
    domain = json.loads((entry.path / DOMAIN_FILE).read_text())
    assert domain["samples"] == len(samples) and domain["hardware"] == ["test-cpu"]
    assert said == [f"training roofline on {len(samples)} profiles"]
    again = train_iteration_model("roofline", samples, name="base", models_dir=tmp_path)
    assert again.ref == "base/v2" and registry.promoted_ref("cpu-step") == "base/v1"  # not promoted unless asked


def test_no_samples_or_an_unknown_regressor_is_refused(tmp_path):
    with pytest.raises(PerfmodelError, match="no usable profiles"):
        train_iteration_model("roofline", [], models_dir=tmp_path)
    with pytest.raises(PerfmodelError, match="xgb-nope"):
        train_iteration_model("xgb-nope", [], models_dir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_the_device_model_is_trained_on_the_store_rows_and_promoted(tmp_path):
    if not NEUSIGHT.is_dir():
        pytest.skip(f"public dataset 'neusight' not found at {NEUSIGHT} (set PERFMODEL_DATASETS_DIR)")
    importer = get_importer("neusight")
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with ProfileStore(url) as store:
        for gpu in GPUS:
            file = f"data/dataset/train/collect/linear/p2.1.0/{gpu}.csv.gz"
            store.add_op_measurements(islice(importer(NEUSIGHT, stats=ImportStats(), files=[file]), 60))
    models = tmp_path / "models"
    assert promoted_device_ops_model(models) == (None, None)
    entry = train_device_ops_model(url, ["neusight"], name="ops", promote=True, models_dir=models,
                                   estimator_settings=FAST)
    assert entry.ref == "ops/v1" and ModelRegistry(models).promoted_ref("device-ops") == "ops/v1"
    domain = json.loads((entry.path / DOMAIN_FILE).read_text())
    assert domain["sources"] == ["neusight"] and domain["op_classes"] == ["linear"] and len(domain["devices"]) == 3
    model, ref = device_ops_model(None, models)
    assert ref == "ops/v1" and model.n_estimators == FAST["n_estimators"]
    assert promoted_device_ops_model(models)[1] == "ops/v1"


def test_the_device_model_needs_imported_rows(sqlite_url, tmp_path):
    with pytest.raises(PerfmodelError, match="no op measurements of neusight.*perfmodel import"):
        train_device_ops_model(sqlite_url, ["neusight"], models_dir=tmp_path)

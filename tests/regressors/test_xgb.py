"""xgb-ops and xgb-graph beyond the estimator contract (test_contract.py): breakdown, learning, the manifest.

Samples are built from real graphs of small modules (captured with torch.export on the meta device) with a
synthetic, physically shaped target: each node takes a kind-dependent multiple of its roofline time plus a
dispatch cost, with log-normal noise; the iteration adds a fixed cost and an optimizer term.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from perfmodel.core.errors import PerfmodelError, UnknownNameError
from perfmodel.features.nodes import NODE_FEATURES, node_cost, roofline_ms
from perfmodel.features.sample import Sample
from perfmodel.features.whole_graph import GRAPH_FEATURES, graph_feature_matrix
from perfmodel.graph.from_torch import graph_from_module
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import JobSpec, ModuleSource
from perfmodel.regressors import REGRESSORS, load_regressor, regressor_class
from perfmodel.regressors._xgb import nnls
from perfmodel.regressors.manifest import MANIFEST_FILE
from perfmodel.regressors.xgb_graph import XGBGraphRegressor
from perfmodel.regressors.xgb_ops import XGBOpsRegressor

HW = HardwareSpec(name="test-cpu", kind="cpu", peak_fp32_gflops=200.0, memory_bandwidth_gb_s=20.0, memory_gb=16.0,
                  compute_units=2, threads=2, source="test")
FAST = {"n_estimators": 20, "max_depth": 4, "inner_folds": 3, "nthread": 1}


class MLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, width), nn.GELU(),
                                 nn.Linear(width, 10))

    def forward(self, x):
        return self.net(x).sum()


class CNN(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
                                 nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Linear(channels, 10))

    def forward(self, x):
        return self.net(x).sum()


class Attention(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        return self.out(torch.nn.functional.scaled_dot_product_attention(q, k, v)).sum()


# family -> (module builder, input builder)
MODELS = {
    "mlp": (lambda: MLP(64), lambda b: torch.zeros(b, 32)),
    "cnn": (lambda: CNN(8), lambda b: torch.zeros(b, 3, 16, 16)),
    "attention": (lambda: Attention(32), lambda b: torch.zeros(b, 16, 32)),
}
KIND_EFFICIENCY = {"linear": 0.4, "conv": 0.25, "attention": 0.2, "batchnorm": 0.1}


def _synthetic_sample(family: str, batch_size: int, optimizer: str, rng: np.random.Generator) -> Sample:
    build_module, build_input = MODELS[family]
    with torch.device("meta"):
        module = build_module()
        graph = graph_from_module(module, (build_input(batch_size),), name=family, mode="train")
    spec = JobSpec(source=ModuleSource(path=f"tests/{family}.py:make"), batch_size=batch_size, optimizer=optimizer)
    node_times = {}
    for node in graph.nodes:
        if node.kind.value == "view":
            continue
        for phase in ("forward", "backward"):
            flops, read, written = node_cost(node, phase)
            if phase == "backward" and flops + read + written == 0:
                continue
            efficiency = KIND_EFFICIENCY.get(node.kind.value, 0.05)
            ms = roofline_ms(flops, read + written, HW) / efficiency + 0.01
            node_times[(node.id, phase)] = ms * math.exp(rng.normal(0, 0.1))
    optimizer_ms = graph.totals.params * 4 * (5 if optimizer == "sgd" else 7) / (HW.memory_bandwidth_gb_s * 1e6)
    iteration = (sum(node_times.values()) + 0.5 + 3 * optimizer_ms) * math.exp(rng.normal(0, 0.03))
    return Sample(spec=spec, graph=graph, hardware=HW, family=family, iter_time_ms=iteration,
                  iter_time_cv=0.03, node_times_ms=node_times, profile_id=len(node_times) + batch_size)


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    rng = np.random.default_rng(0)
    return [_synthetic_sample(family, batch, optimizer, rng)
            for family in MODELS for batch in (2, 4, 8) for optimizer in ("sgd", "adam")]


@pytest.fixture(scope="module", params=[XGBOpsRegressor, XGBGraphRegressor], ids=["xgb-ops", "xgb-graph"])
def fitted(request, samples):
    return request.param(**FAST).fit(samples)


def _arrays(prediction) -> dict[str, np.ndarray]:
    return {name: np.asarray(getattr(prediction, name)) for name in prediction.__dataclass_fields__}


def _state(model) -> dict:
    state = {k: v for k, v in vars(model).items() if k != "booster_"}
    return {"params": json.dumps(state, sort_keys=True, default=repr),
            "booster": bytes(model.booster_.save_raw("json"))}


def test_breakdown_sums_to_iteration(fitted, samples):
    out = fitted.predict(samples)
    total = out.forward_ms + out.backward_ms + out.optimizer_ms + out.overhead_ms
    np.testing.assert_allclose(total, out.iter_time_ms, rtol=1e-6)
    assert np.all(out.iter_time_ms > 0)
    assert np.all(out.forward_ms > 0) and np.all(out.backward_ms > 0)
    assert np.all(out.optimizer_ms >= 0) and np.all(out.overhead_ms >= 0)


def test_learns_the_synthetic_target(fitted, samples):
    out = fitted.predict(samples)
    measured = np.array([s.iter_time_ms for s in samples])
    assert np.median(np.abs(out.iter_time_ms - measured) / measured) < 0.25


def test_manifest_records_features_artifact_and_training_data(fitted, samples, tmp_path):
    """Beyond the contract's save/load round trip (test_contract.py): what the manifest holds."""
    directory = fitted.save(tmp_path / "model")
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    assert manifest["artifacts"] == ["model.ubj"] and (directory / "model.ubj").is_file()
    assert manifest["training_samples"] == len(samples) and manifest["training_data_hash"]
    assert "interval" in manifest["normalisation"]
    expected = NODE_FEATURES if fitted.name == "xgb-ops" else GRAPH_FEATURES
    assert tuple(manifest["feature_names"]) == expected


def test_load_refuses_other_feature_names(fitted, tmp_path):
    directory = fitted.save(tmp_path / "model")
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    manifest["feature_names"] = [*manifest["feature_names"][:-1], "log_something_else"]
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(PerfmodelError, match="other features"):
        type(fitted).load(directory)


def test_a_model_saved_as_text_json_still_loads_and_predicts_the_same(fitted, samples, tmp_path):
    """Models saved before the binary format (model.json, named in their manifest) load as they are."""
    import xgboost as xgb

    directory = fitted.save(tmp_path / "model")
    booster = xgb.Booster()
    booster.load_model(str(directory / "model.ubj"))
    booster.save_model(str(directory / "model.json"))
    (directory / "model.ubj").unlink()
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    (directory / MANIFEST_FILE).write_text(json.dumps({**manifest, "artifacts": ["model.json"]}))
    loaded = type(fitted).load(directory)
    np.testing.assert_array_equal(loaded.predict(samples).iter_time_ms, fitted.predict(samples).iter_time_ms)


def test_graph_features_are_named_and_ordered(samples):
    x = graph_feature_matrix([(s.graph, s.hardware, s.spec) for s in samples[:2]])
    assert x.shape == (2, len(GRAPH_FEATURES)) and len(set(GRAPH_FEATURES)) == len(GRAPH_FEATURES)
    assert np.all(np.isfinite(x))


def test_registry_table():
    assert set(REGRESSORS) == {"roofline", "xgb-ops", "xgb-graph", "gnn", "xgb-device-ops", "xgb-whole-step",
                                 "gnn-whole-step", "device-whole-step"}
    with pytest.raises(UnknownNameError):
        regressor_class("xgb-device-ops", iteration=True)  # learns ops, not iterations
    assert regressor_class("xgb-ops") is XGBOpsRegressor
    assert regressor_class("xgb-graph") is XGBGraphRegressor
    with pytest.raises(UnknownNameError, match="xgb-ops"):
        regressor_class("xgb-op")


def test_load_regressor_without_manifest(tmp_path):
    with pytest.raises(PerfmodelError, match="manifest"):
        load_regressor(tmp_path)


def test_nnls_matches_a_known_non_negative_solution():
    rng = np.random.default_rng(1)
    a = rng.uniform(0, 1, size=(40, 3))
    b = a @ np.array([2.0, 0.0, 0.5]) - 0.3 * a[:, 1]  # unconstrained optimum has a negative middle coefficient
    x = nnls(a, b)
    expected = np.zeros(3)
    expected[[0, 2]] = np.linalg.lstsq(a[:, [0, 2]], b, rcond=None)[0]
    np.testing.assert_allclose(x, expected, rtol=1e-9)


def _saved_booster(path, seed: int):
    import xgboost as xgb

    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(64, 3)), rng.normal(size=64)
    booster = xgb.train({"max_depth": 2, "nthread": 1, "seed": seed}, xgb.DMatrix(x, label=y), num_boost_round=3)
    booster.save_model(str(path))
    return xgb.DMatrix(x)


def test_a_booster_is_parsed_once_per_process_for_the_same_content_and_again_once_it_changes(tmp_path):
    """`read_booster` shares one parsed booster between loads of the same content (the same file, a hard link, a
    copy: every service test's registry copy), runs `prepare` once, and parses a rewritten file anew; a shared
    booster predicts as a freshly loaded one."""
    import os
    import shutil

    import xgboost as xgb

    from perfmodel.regressors._xgb import read_booster

    path = tmp_path / "model.ubj"
    data = _saved_booster(path, seed=0)
    prepared = []
    first = read_booster(path, prepared.append)
    assert read_booster(path, prepared.append) is first
    assert prepared == [first]
    os.link(path, tmp_path / "linked.ubj")
    shutil.copy(path, tmp_path / "copied.ubj")
    assert read_booster(tmp_path / "linked.ubj") is first
    assert read_booster(tmp_path / "copied.ubj") is first
    fresh = xgb.Booster()
    fresh.load_model(str(path))
    np.testing.assert_array_equal(first.predict(data), fresh.predict(data))

    _saved_booster(path, seed=1)  # another model written over the same file
    second = read_booster(path)
    assert second is not first
    fresh.load_model(str(path))
    np.testing.assert_array_equal(second.predict(data), fresh.predict(data))
    assert read_booster(tmp_path / "copied.ubj") is first  # the old content's copy still answers with the old model


def test_a_shared_booster_answers_two_engines_the_same_as_a_private_parse(tmp_path, samples):
    """Two loads of the shipped xgb-ops model (the second through a hard-linked copy of the registry, as the
    service tests make) share their booster, and it predicts exactly as the same model parsed on its own."""
    import xgboost as xgb

    from perfmodel.registry.registry import ModelRegistry
    from tests.conftest import copy_shipped_models

    entry = ModelRegistry().get(None, role="cpu-step")
    linked = copy_shipped_models(tmp_path / "linked")
    one, two = load_regressor(entry.path), load_regressor(ModelRegistry(linked).get(entry.ref).path)
    assert one.booster_ is two.booster_
    private = load_regressor(entry.path)
    own = xgb.Booster()
    own.load_model(str(entry.path / "model.ubj"))
    own.feature_names = one.booster_.feature_names
    private.booster_ = own
    for name, values in _arrays(one.predict(samples)).items():
        np.testing.assert_array_equal(values, _arrays(private.predict(samples))[name], err_msg=name)

"""GNNRegressor beyond the estimator contract (test_contract.py): persistence without pickle, breakdown, the seed
and that message passing uses the graph's edges. Real graphs of tiny modules (captured on the meta device) at three
batch sizes on two hardware specs, with synthetic targets shaped like real timings (roofline + per-op launch cost)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from perfmodel.core.errors import PerfmodelError
from perfmodel.features.nodes import has_phase, node_cost, roofline_ms
from perfmodel.features.sample import Sample
from perfmodel.graph.from_torch import graph_from_module
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import JobSpec, ModuleSource
from perfmodel.regressors.gnn import FEATURE_NAMES, WEIGHTS_FILE, GNNRegressor
from perfmodel.regressors.manifest import Manifest

SMALL = dict(hidden=16, layers=2, epochs=25, lr=1e-2, batch_graphs=6, threads=1, seed=0)
BATCHES = (2, 4, 8)
HARDWARE = (
    HardwareSpec(name="test-cpu-small", kind="cpu", peak_fp32_gflops=50, memory_bandwidth_gb_s=10, memory_gb=8,
                 compute_units=2, threads=2, source="test"),
    HardwareSpec(name="test-cpu-big", kind="cpu", peak_fp32_gflops=400, memory_bandwidth_gb_s=40, memory_gb=64,
                 compute_units=16, threads=16, source="test"),
)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 10)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.bn, self.c2, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), \
            nn.Conv2d(8, 8, 3, padding=1), nn.Linear(8, 10)

    def forward(self, x):
        h = torch.relu(self.bn(self.c1(x)))
        h = h + torch.relu(self.c2(h))
        return self.fc(h.mean((2, 3)))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out, self.norm = nn.Linear(32, 96), nn.Linear(32, 32), nn.LayerNorm(32)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        h = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.norm(x + self.out(h)).sum()


MODELS = {"mlp": (MLP, lambda b: torch.randn(b, 32)), "cnn": (CNN, lambda b: torch.randn(b, 3, 16, 16)),
          "attn": (Attention, lambda b: torch.randn(b, 16, 32))}


def synthetic_sample(family: str, batch: int, hw: HardwareSpec, mode: str = "train") -> Sample:
    """Node time = 3 x roofline + 5 µs launch; iteration = nodes + optimizer (params streamed 4x) + 0.2 ms."""
    make, inputs = MODELS[family]
    with torch.device("meta"):
        module, x = make(), inputs(batch)
    graph = graph_from_module(module, (x,), name=family, mode=mode)
    times = {}
    for node in graph.nodes:
        for phase in ("forward", "backward") if mode == "train" else ("forward",):
            if has_phase(node, phase):
                flops, read, written = node_cost(node, phase)
                times[(node.id, phase)] = 3 * roofline_ms(flops, read + written, hw) + 0.005
    optimizer = 4 * graph.totals.param_bytes / (hw.memory_bandwidth_gb_s * 1e9) * 1e3 if mode == "train" else 0.0
    unattributed = optimizer + 0.2
    spec = JobSpec(source=ModuleSource(path=f"tiny.py:{family}"), batch_size=batch, mode=mode)
    return Sample(spec=spec, graph=graph, hardware=hw, family=family,
                  iter_time_ms=sum(times.values()) + unattributed, node_times_ms=times,
                  unattributed_ms=unattributed)


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    return [synthetic_sample(f, b, hw) for f in MODELS for b in BATCHES for hw in HARDWARE]


@pytest.fixture(scope="module")
def fitted(samples) -> GNNRegressor:
    return GNNRegressor(**SMALL).fit(samples)


def _state(model: GNNRegressor) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.net_.state_dict().items()}


def test_fit_rejects_unmeasured_samples(samples):
    unmeasured = Sample(spec=samples[0].spec, graph=samples[0].graph, hardware=samples[0].hardware, family="mlp")
    with pytest.raises(PerfmodelError, match="iter_time_ms"):
        GNNRegressor(**SMALL).fit([unmeasured])


def test_breakdown_sums_to_total_and_interval_is_ordered(fitted, samples):
    p = fitted.predict(samples)
    total = p.forward_ms + p.backward_ms + p.optimizer_ms + p.overhead_ms
    np.testing.assert_allclose(total, p.iter_time_ms, rtol=1e-12)
    for part in (p.forward_ms, p.backward_ms, p.optimizer_ms, p.overhead_ms):
        assert np.all(part >= 0)
    assert np.all(p.backward_ms > 0) and np.all(p.optimizer_ms > 0)  # training graphs
    assert np.all(p.p10_ms <= p.iter_time_ms) and np.all(p.iter_time_ms <= p.p90_ms)


def test_inference_graph_has_no_backward_or_optimizer(fitted):
    p = fitted.predict([synthetic_sample("mlp", 4, HARDWARE[0], mode="inference")])
    assert p.backward_ms[0] == 0 and p.optimizer_ms[0] == 0 and p.iter_time_ms[0] > 0


def test_learns_the_synthetic_targets(fitted, samples):
    measured = np.array([s.iter_time_ms for s in samples])
    ape = np.abs(fitted.predict(samples).iter_time_ms - measured) / measured
    assert np.median(ape) < 0.35, ape
    assert fitted.metrics_["train"]["n"] == len(samples)
    assert len(fitted.metrics_["calibration"]["held_out_families"]) == 1


def test_predict_nodes_covers_each_phase(fitted, samples):
    sample = samples[0]
    nodes = fitted.predict_nodes([sample])[0]
    assert set(nodes) == set(sample.node_times_ms)
    total = fitted.predict([sample])
    np.testing.assert_allclose(sum(v for (_, ph), v in nodes.items() if ph == "forward"), total.forward_ms[0],
                               rtol=1e-5)


def test_saved_without_pickle_and_the_manifest_records_the_architecture(fitted, samples, tmp_path):
    """Beyond the contract's save/load round trip (test_contract.py): the files written and what the manifest holds."""
    path = fitted.save(tmp_path)
    assert path.name == "manifest.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["manifest.json", WEIGHTS_FILE])
    manifest = Manifest.read(tmp_path)
    assert manifest.regressor == "gnn" and manifest.feature_names == FEATURE_NAMES
    assert manifest.artifacts == (WEIGHTS_FILE,) and manifest.training_samples == len(samples)
    assert manifest.settings["architecture"]["hidden"] == SMALL["hidden"]
    assert len(manifest.normalisation["node_mean"]) == len(manifest.normalisation["node_std"])
    assert manifest.training_data_hash


def test_load_refuses_other_features_or_regressor(fitted, tmp_path):
    fitted.save(tmp_path)
    data = json.loads((tmp_path / "manifest.json").read_text())
    data["feature_names"] = data["feature_names"][:-1]
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(PerfmodelError, match="features"):
        GNNRegressor.load(tmp_path)
    data["feature_names"], data["regressor"] = list(FEATURE_NAMES), "xgb-graph"
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(PerfmodelError, match="gnn"):
        GNNRegressor.load(tmp_path)


def test_another_seed_gives_other_predictions(samples):
    """The contract checks that the same seed reproduces; here, that the seed is actually used."""
    subset = samples[::2]
    settings = {**SMALL, "epochs": 5}
    a = GNNRegressor(**settings).fit(subset).predict(subset).iter_time_ms
    c = GNNRegressor(**{**settings, "seed": 1}).fit(subset).predict(subset).iter_time_ms
    assert not np.array_equal(a, c)


def test_message_passing_uses_edges(fitted, samples):
    sample = next(s for s in samples if s.family == "cnn")
    cut = sample.graph.model_copy(update={"nodes": tuple(n.model_copy(update={"inputs": ()})
                                                         for n in sample.graph.nodes)})
    with_edges = fitted.predict_nodes([sample])[0]
    without = fitted.predict_nodes([Sample(spec=sample.spec, graph=cut, hardware=sample.hardware,
                                           family=sample.family)])[0]
    # a node with a producer and a consumer sees different neighbourhoods; the first node (no producer) changes too
    # because its consumers' messages are gone
    changed = [k for k in with_edges if not np.isclose(with_edges[k], without[k], rtol=1e-6)]
    assert len(changed) >= len(with_edges) // 2

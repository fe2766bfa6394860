"""gnn-whole-step: the estimator contract (fit returns self, predict has no side effect, seeded and deterministic,
save/load predicts the same), the band brackets the median, it learns a synthetic dependence on the global vector
and on the graph, and the compressed graph embeds exactly as the whole graph.

Graphs: zoo resnet18 and bert-small at batch 2 (captured on the meta device once for the module) and a prefix of
each (a smaller DAG of the same ops): four graphs, two "families". Targets are synthetic."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph
from perfmodel.regressors.manifest import Manifest
from perfmodel.regressors.whole_step import TARGET
from perfmodel.regressors.whole_step_gnn import (
    NODE_INPUTS,
    CompressedGraph,
    WholeStepGNN,
    WholeStepNet,
    _GraphBatch,
    compress_graph,
    node_inputs,
)

FEATURES = ("a", "b")
SMALL = {"hidden": 16, "layers": 2, "epochs": 80, "lr": 1e-2, "inner_folds": 2, "seed": 0,
         "feature_names": FEATURES}


@pytest.fixture(scope="module")
def graphs() -> dict[str, Graph]:
    from perfmodel.graph import graph_for_job
    from perfmodel.jobs.spec import JobSpec

    torch.set_num_threads(1)
    whole = {zoo: graph_for_job(JobSpec.from_options(zoo=zoo, batch_size=2, seq_len=32))
             for zoo in ("resnet18", "bert-small")}
    prefixes = {f"{zoo}-head": g.model_copy(update={"nodes": g.nodes[:len(g.nodes) // 2]}) for zoo, g in whole.items()}
    return {**whole, **prefixes}


def synthetic(graphs: dict[str, Graph], rows_per_graph: int = 24, seed: int = 0
              ) -> tuple[pd.DataFrame, list[Graph], list[str]]:
    """Rows over the four graphs: log_ratio = 0.4 a - 0.2 b + 0.3 on BERT graphs (which no column tells)."""
    rng = np.random.default_rng(seed)
    names = [name for name in graphs for _ in range(rows_per_graph)]
    frame = pd.DataFrame({"a": rng.uniform(0, 1, len(names)), "b": rng.uniform(0, 1, len(names))})
    bert = np.array([name.startswith("bert") for name in names])
    frame[TARGET] = 0.4 * frame.a - 0.2 * frame.b + 0.3 * bert + rng.normal(0, 0.02, len(names))
    return frame, [graphs[name] for name in names], [name.split("-")[0] for name in names]


@pytest.fixture(scope="module")
def fitted(graphs: dict[str, Graph]) -> tuple[WholeStepGNN, pd.DataFrame, list[Graph]]:
    frame, rows, groups = synthetic(graphs)
    model = WholeStepGNN(**SMALL)
    assert model.fit(frame, rows, groups) is model
    return model, frame, rows


def _weights(model: WholeStepGNN) -> dict[str, bytes]:
    return {k: v.numpy().tobytes() for k, v in model.net_.state_dict().items()}


def test_init_stores_settings_only():
    model = WholeStepGNN(**SMALL)
    assert not [k for k in vars(model) if k.endswith("_")]
    assert WholeStepGNN(**model.get_params()).get_params() == model.get_params()


def test_learns_the_global_and_the_graph_dependence(fitted):
    model, frame, rows = fitted
    out = model.predict(frame, rows)
    error = np.abs(out.log_factor - frame[TARGET])
    assert error.mean() < 0.06, error.mean()  # predicting the mean would be off by ~0.15
    bert = np.array([g.name.startswith("bert") for g in rows])
    gap = out.log_factor[bert].mean() - out.log_factor[~bert].mean()
    assert 0.2 < gap < 0.4, gap  # the 0.3 only the graph tells
    assert np.all(out.log_low <= out.log_factor) and np.all(out.log_factor <= out.log_high)
    assert model.metrics_["compressed_nodes"] < model.metrics_["ir_nodes"]


def test_predict_has_no_side_effects(fitted):
    model, frame, rows = fitted
    before_frame, before_weights = frame.copy(), _weights(model)
    first, second = model.predict(frame, rows), model.predict(frame, rows)
    pd.testing.assert_frame_equal(frame, before_frame)
    assert _weights(model) == before_weights
    np.testing.assert_array_equal(first.log_factor, second.log_factor)
    np.testing.assert_array_equal(first.log_high, second.log_high)


def test_save_load_predicts_the_same(fitted, tmp_path):
    model, frame, rows = fitted
    model.save(tmp_path / "m")
    assert Manifest.read(tmp_path / "m").regressor == "gnn-whole-step"
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["gnn-whole-step.safetensors", "manifest.json"]
    expected = model.predict(frame, rows)
    loaded = WholeStepGNN.load(tmp_path / "m")
    assert loaded.get_params() == model.get_params()
    out = loaded.predict(frame, rows)
    np.testing.assert_array_equal(out.log_factor, expected.log_factor)
    np.testing.assert_array_equal(out.log_low, expected.log_low)
    np.testing.assert_array_equal(out.log_high, expected.log_high)


def test_same_seed_same_predictions(graphs, fitted):
    _, frame, rows = fitted
    frame_small, rows_small, groups = synthetic(graphs, rows_per_graph=6, seed=1)
    settings = {**SMALL, "epochs": 20}
    a = WholeStepGNN(**settings).fit(frame_small, rows_small, groups).predict(frame, rows)
    b = WholeStepGNN(**settings).fit(frame_small, rows_small, groups).predict(frame, rows)
    np.testing.assert_array_equal(a.log_factor, b.log_factor)


def test_graphs_compressed_ahead_predict_the_same(fitted):
    model, frame, rows = fitted
    compressed = {id(g): model.compress(g) for g in rows}
    ahead = model.predict(frame, [compressed[id(g)] for g in rows])
    np.testing.assert_array_equal(ahead.log_factor, model.predict(frame, rows).log_factor)
    with pytest.raises(PerfmodelError, match="rounds"):
        model.predict(frame, [compress_graph(g, rounds=1) for g in rows])


def test_compressed_graph_embeds_as_the_whole_graph(graphs):
    graph = graphs["bert-small"]
    x = node_inputs(graph)
    index = {node.id: i for i, node in enumerate(graph.nodes)}
    down = np.asarray([(index[s], i) for i, node in enumerate(graph.nodes) for s in node.inputs if s in index]).T
    whole = CompressedGraph(x=x, count=np.ones(len(x)), down=down, up=down[::-1].copy(), nodes=len(x), rounds=3)
    compressed = compress_graph(graph, rounds=3)
    assert len(compressed.count) < len(x) and compressed.count.sum() == len(x)
    torch.manual_seed(0)
    net = WholeStepNet(len(NODE_INPUTS), 2, hidden=8, layers=3, dropout=0.0).eval()
    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-3
    with torch.no_grad():
        z = [net.embed(b.x, b.down, b.up, b.count, b.batch, 1) for b in
             (_GraphBatch.of([g], mean, std) for g in (whole, compressed))]
    torch.testing.assert_close(z[0], z[1], rtol=1e-4, atol=1e-5)


def test_clear_errors(fitted):
    model, frame, rows = fitted
    with pytest.raises(PerfmodelError, match="not fitted"):
        WholeStepGNN(**SMALL).predict(frame, rows)
    with pytest.raises(PerfmodelError, match="one graph per row"):
        model.predict(frame, rows[:-1])
    with pytest.raises(PerfmodelError, match="missing"):
        model.predict(frame.drop(columns="b"), rows)

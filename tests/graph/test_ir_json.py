"""The graph IR round-trips through JSON; other schema versions are refused."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from perfmodel.core.errors import PerfmodelError
from perfmodel.graph import SCHEMA_VERSION, Graph, graph_from_module, summarize


@pytest.fixture(scope="module")
def small_graph() -> Graph:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 4))
    return graph_from_module(model, (torch.randn(2, 3, 16, 16),), name="small", mode="train", job_id="abc")


def test_json_round_trip(small_graph):
    text = small_graph.to_json()
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION
    restored = Graph.from_json(text)
    assert restored == small_graph
    assert restored.edges == small_graph.edges
    assert small_graph.totals.flops_bwd > 0 and small_graph.totals.params == 3 * 8 * 9 + 8 + 16 + 8 * 4 + 4


@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1, 0, None])
def test_other_schema_versions_are_refused(small_graph, version):
    data = json.loads(small_graph.to_json())
    data["schema_version"] = version
    with pytest.raises(PerfmodelError, match="schema_version"):
        Graph.from_json(json.dumps(data))


def test_summary_lists_where_the_flops_go(small_graph):
    summary = summarize(small_graph)
    assert summary["flops_fwd"] == small_graph.totals.flops_fwd
    assert summary["top_kinds_by_flops"][0]["kind"] == "conv"
    assert 0.99 < sum(k["share"] for k in summary["top_kinds_by_flops"]) <= 1.0  # the top five kinds
    json.dumps(summary)  # printable as JSON

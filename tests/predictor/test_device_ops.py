"""A graph's time from its kernel rows' predicted latencies (perfmodel.predictor.device_ops)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from perfmodel.core.errors import PerfmodelError
from perfmodel.graph.from_torch import graph_from_module
from perfmodel.hardware.catalog import load_catalog
from perfmodel.lowering.ops import op_roofline_ms as roofline_ms
from perfmodel.lowering.rows import graph_op_rows
from perfmodel.predictor.device_ops import predict_graph_ms, summed_ms

DEVICE = "v100-pcie-32gb"


@pytest.fixture(scope="module")
def mlp():
    module = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 32))
    return graph_from_module(module.train(), (torch.randn(8, 64),), name="mlp", mode="train")


def test_predict_graph_ms_sums_the_rows(mlp):
    catalog = load_catalog()
    result = predict_graph_ms(mlp, DEVICE, lambda ops: roofline_ms(ops, catalog), catalog)
    rows = graph_op_rows(mlp).assign(device=DEVICE)
    totals = summed_ms(rows, roofline_ms(rows, catalog))
    assert result["forward_ms"] == pytest.approx(totals["forward"])
    assert result["backward_ms"] == pytest.approx(totals["backward"])
    assert result["total_ms"] == pytest.approx(totals["forward"] + totals["backward"])
    assert result["rows"] == len(rows)
    assert sum(v["forward"] for v in result["by_kind_ms"].values()) == pytest.approx(result["forward_ms"])
    assert sum(v["backward"] for v in result["by_class_ms"].values()) == pytest.approx(result["backward_ms"])
    assert result["by_kind_ms"]["linear"]["backward"] > result["by_kind_ms"]["linear"]["forward"] > 0
    ones = predict_graph_ms(mlp, DEVICE, lambda ops: np.ones(len(ops)))
    assert ones["total_ms"] == len(rows)
    with pytest.raises(PerfmodelError, match="catalog"):
        predict_graph_ms(mlp, "no-such-gpu", lambda ops: np.ones(len(ops)), catalog)
    with pytest.raises(PerfmodelError, match="predictions"):
        summed_ms(rows, np.ones(3))

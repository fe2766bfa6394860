"""Service fixtures: an app on a fresh store (SQLite, and PostgreSQL where PERFMODEL_TEST_POSTGRES_URL is set)
serving a private copy of the shipped models (promotions write the registry's promoted.json), plus small jobs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import ServiceSettings, hash_token
from tests.conftest import copy_shipped_models

WRITE_TOKEN = "write-token-for-tests"
READ_TOKEN = "read-token-for-tests"
SMALL_JOB = {"source": {"kind": "zoo", "name": "mlp-recommender"}, "batch_size": 8}

# A capture's budget at least this large is answered from this worker's earlier capture of the same spec and limits
# (`_captured_once`); smaller budgets are the tests of the budget itself and always capture.
MEMO_MIN_BUDGET_S = 30.0
_CAPTURED: dict[tuple[str, str], str] = {}


@pytest.fixture(autouse=True)
def _captured_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each service test starts a new app, whose engine captures every job it registers again, in a child of the
    capture fork server: the same few specs, hundreds of times in a run. Here a spec (with its limits) that a child
    of this worker captured once is answered with that graph after; refusals and failures are never kept, so every
    test of a limit, a timeout or a bad model meets the real child."""
    from perfmodel.core.ir import Graph
    from perfmodel.graph import capture

    real = capture._capture_in_child

    def once(spec, timeout_s, limits):
        key = (spec.model_dump_json(), limits.model_dump_json())
        if timeout_s >= MEMO_MIN_BUDGET_S and key in _CAPTURED:
            return Graph.from_json(_CAPTURED[key])
        graph = real(spec, timeout_s, limits)
        _CAPTURED[key] = graph.to_json()
        return graph

    monkeypatch.setattr(capture, "_capture_in_child", once)


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    return copy_shipped_models(tmp_path / "models")


@pytest.fixture
def settings(store_url: str, models_dir: Path) -> ServiceSettings:
    return ServiceSettings(store_url=store_url, models_dir=models_dir, sync_interval_s=0)


def make_client(settings: ServiceSettings, token: str | None = None) -> TestClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return TestClient(create_app(settings), headers=headers, raise_server_exceptions=False)


@pytest.fixture
def client(settings: ServiceSettings) -> Iterator[TestClient]:
    with make_client(settings) as opened:
        yield opened


@pytest.fixture
def secured(store_url: str, models_dir: Path) -> ServiceSettings:
    return ServiceSettings(store_url=store_url, models_dir=models_dir, sync_interval_s=0,
                           token_sha256=hash_token(WRITE_TOKEN), read_token_sha256=hash_token(READ_TOKEN))


@pytest.fixture(scope="session")
def small_ir() -> dict:
    """The graph IR `perfmodel graph mlp-recommender -b 8 --json` prints."""
    from perfmodel.graph import graph_for_job
    from perfmodel.jobs.spec import JobSpec

    return json.loads(graph_for_job(JobSpec.model_validate(SMALL_JOB)).to_json())


def small_onnx(path: Path, *, hidden: int = 64) -> Path:
    """A two-layer MLP in ONNX, built with onnx.helper (batch dimension symbolic)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w1 = numpy_helper.from_array(np.ones((32, hidden), np.float32), "w1")
    w2 = numpy_helper.from_array(np.ones((hidden, 10), np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["a"]),
         helper.make_node("MatMul", ["a", "w2"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], initializer=[w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path

"""The estimator contract (perfmodel/regressors/base.py), checked once over every regressor in `REGRESSORS`:

- `__init__` stores settings only: no I/O, nothing fitted, `get_params()` rebuilds an equal estimator;
- a learned regressor refuses to predict before it is fitted (a `PerfmodelError`, not an AttributeError);
- `fit` returns the estimator itself;
- `predict` has no side effects: the same input twice gives the same output, and the estimator's state (settings,
  boosters, network weights) is unchanged;
- `save` writes a manifest naming the regressor; `load` (and `load_regressor`) predicts identically;
- intervals contain the median: low <= median <= high, all finite and positive;
- determinism: the same seed on the same data gives the same predictions.

Data, kept tiny so the whole file runs in seconds:
- iteration regressors (`Sample`s): real graphs of three small modules captured on the meta device at two batch
  sizes on two CPU specs, with a synthetic target shaped like real timings (node roofline x a kind factor + launch
  cost, plus an optimizer term). The shipped corpus (profiles/) is real, but importing it and capturing its graphs
  takes minutes on this machine, which the learning tests in test_xgb.py / test_gnn.py / the evaluation tests cover.
- `xgb-device-ops` (op rows): a real import of the NeuSight test split's softmax and layernorm rows (five GPUs,
  read in place from the public datasets), 12 rows per device and class; skips, saying why, without the datasets.
"""

from __future__ import annotations

import builtins
import io
import os
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

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
from perfmodel.regressors import REGRESSORS, load_regressor, regressor_class
from perfmodel.regressors.manifest import Manifest

HARDWARE = (
    HardwareSpec(name="contract-cpu-small", kind="cpu", peak_fp32_gflops=50, memory_bandwidth_gb_s=10, memory_gb=8,
                 compute_units=2, threads=2, source="test"),
    HardwareSpec(name="contract-cpu-big", kind="cpu", peak_fp32_gflops=400, memory_bandwidth_gb_s=40, memory_gb=64,
                 compute_units=16, threads=16, source="test"),
)
KIND_FACTOR = {"linear": 2.5, "conv": 4.0, "attention": 5.0}
NEUSIGHT_FILES = ("data/dataset/test/softmax.csv", "data/dataset/test/ln.csv")
ROWS_PER_DEVICE_AND_CLASS = 12


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(32, 64), nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x))).sum()


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3))).sum()


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(32, 96), nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.out(torch.nn.functional.scaled_dot_product_attention(q, k, v)).sum()


MODULES: dict[str, tuple[Callable[[], nn.Module], Callable[[int], torch.Tensor]]] = {
    "mlp": (MLP, lambda b: torch.zeros(b, 32)),
    "cnn": (CNN, lambda b: torch.zeros(b, 3, 8, 8)),
    "attention": (Attention, lambda b: torch.zeros(b, 8, 32)),
}


def _sample(family: str, batch: int, hw: HardwareSpec, optimizer: str) -> Sample:
    make, inputs = MODULES[family]
    with torch.device("meta"):
        graph = graph_from_module(make(), (inputs(batch),), name=family, mode="train")
    times = {}
    for node in graph.nodes:
        for phase in ("forward", "backward"):
            if has_phase(node, phase):
                flops, read, written = node_cost(node, phase)
                factor = KIND_FACTOR.get(node.kind.value, 1.5)
                times[(node.id, phase)] = factor * roofline_ms(flops, read + written, hw) + 0.005
    passes = 3 if optimizer == "sgd" else 4
    optimizer_ms = 2 * passes * graph.totals.param_bytes / (hw.memory_bandwidth_gb_s * 1e6)
    unattributed = optimizer_ms + 0.2
    spec = JobSpec(source=ModuleSource(path=f"contract.py:{family}"), batch_size=batch, optimizer=optimizer)
    return Sample(spec=spec, graph=graph, hardware=hw, family=family, iter_time_ms=sum(times.values())
                  + unattributed, iter_time_cv=0.02, node_times_ms=times, unattributed_ms=unattributed)


@dataclass(frozen=True)
class Case:
    """How the contract drives one regressor: tiny settings, and its fit / predict signatures."""

    settings: dict[str, Any]
    data: str  # the fixture holding its data: "samples" or "ops"
    learned: bool = True

    def fit(self, model: Any, data: Any) -> Any:
        if self.data == "frame":  # the whole-step stage: a frame of composition features, grouped by family
            frame, groups = data
            return model.fit(frame, groups=groups)
        if self.data == "graph_frame":  # the GNN whole-step stage: the same frame and each row's job graph
            frame, graphs, groups = data
            return model.fit(frame, graphs, groups=groups)
        return model.fit(*data) if self.data == "ops" else model.fit(data)

    def predict(self, model: Any, data: Any) -> dict[str, np.ndarray]:
        """Every array the prediction holds, by field name."""
        if self.data == "graph_frame":
            out = model.predict(data[0], data[1])
        elif self.data == "frame":
            out = model.predict(data[0])
        else:
            out = model.predict(*data) if self.data == "ops" else model.predict(data)
        return {f.name: np.asarray(getattr(out, f.name)) for f in fields(out)}

    def interval(self, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.data in ("frame", "graph_frame"):  # natural-log factors: the factors themselves are positive
            return np.exp(arrays["log_low"]), np.exp(arrays["log_factor"]), np.exp(arrays["log_high"])
        median = arrays["latency_ms"] if self.data == "ops" else arrays["iter_time_ms"]
        return arrays["p10_ms"], median, arrays["p90_ms"]


XGB_SMALL = {"n_estimators": 15, "max_depth": 3, "inner_folds": 3, "nthread": 1, "seed": 0}
CASES: dict[str, Case] = {
    "roofline": Case(settings={}, data="samples", learned=False),
    "xgb-ops": Case(settings=XGB_SMALL, data="samples"),
    "xgb-graph": Case(settings={**XGB_SMALL, "min_child_weight": 1.0}, data="samples"),
    "gnn": Case(settings={"hidden": 8, "layers": 1, "epochs": 8, "batch_graphs": 6, "threads": 1, "seed": 0},
                data="samples"),
    "xgb-device-ops": Case(settings={"n_estimators": 15, "max_depth": 3, "nthread": 1, "seed": 0}, data="ops"),
    "xgb-whole-step": Case(settings={**XGB_SMALL, "min_child_weight": 1.0, "feature_names": ["a", "b"]},
                           data="frame"),
    "gnn-whole-step": Case(settings={"hidden": 8, "layers": 1, "epochs": 5, "inner_folds": 2, "threads": 1, "seed": 0,
                                     "feature_names": ["a", "b"]}, data="graph_frame"),
    "device-whole-step": Case(settings={"feature_names": ["a", "b"], "ridge": 1.0, "unseen_features": ["a"]},
                              data="frame"),
}


def test_every_registered_regressor_has_a_contract_case():
    assert set(CASES) == set(REGRESSORS)


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    return [_sample(family, batch, hw, optimizer)
            for family in MODULES for batch in (2, 8) for hw in HARDWARE
            for optimizer in (("sgd", "adam") if hw is HARDWARE[0] else ("sgd",))]


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, HardwareSpec]]:
    """(op rows, catalog): a real import of a small NeuSight slice through the store, as `perfmodel` reads it."""
    from perfmodel.evaluation.device_ops import training_rows
    from perfmodel.hardware.catalog import load_catalog
    from perfmodel.importers import import_neusight
    from perfmodel.settings import get_settings
    from perfmodel.store import ProfileStore

    root = get_settings().datasets_dir / "neusight"
    if not root.is_dir():
        pytest.skip(f"public dataset 'neusight' not found at {root} (set PERFMODEL_DATASETS_DIR)")
    with ProfileStore(f"sqlite:///{tmp_path_factory.mktemp('contract-ops') / 'store.db'}") as store:
        store.add_op_measurements(import_neusight(root, files=NEUSIGHT_FILES))
        rows = training_rows(store.op_measurements(extra=False))
    rows = rows.groupby(["device", "op_class"], group_keys=False).head(ROWS_PER_DEVICE_AND_CLASS)
    return rows.reset_index(drop=True), load_catalog()


@pytest.fixture(scope="module")
def frame() -> tuple[Any, list[str]]:
    """(composition-feature frame with its `log_ratio` target, the family of each row): the whole-step stage's
    input, synthetic (the real one is composed from public whole-job runs: tests/evaluation/test_real_runs.py)."""
    import pandas as pd

    rng = np.random.default_rng(0)
    rows = pd.DataFrame({"a": rng.uniform(0, 1, 60), "b": rng.uniform(0, 1, 60)})
    rows["log_ratio"] = 0.5 * rows["a"] - 0.2 * rows["b"] + rng.normal(0, 0.02, 60)
    return rows, [f"family{i % 5}" for i in range(60)]


@pytest.fixture(scope="module")
def graph_frame(frame: tuple[Any, list[str]], samples: list[Sample]) -> tuple[Any, list[Any], list[str]]:
    """`frame` with a job graph per row: the contract modules' graphs, one per family."""
    rows, groups = frame
    graph_of = {family: s.graph for s in samples for family in [s.family]}
    families = sorted(graph_of)
    return rows, [graph_of[families[int(g[-1]) % len(families)]] for g in groups], groups


@pytest.fixture(scope="module", params=sorted(REGRESSORS))
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def case(name: str) -> Case:
    return CASES[name]


@pytest.fixture(scope="module")
def data(case: Case, request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(case.data)


@pytest.fixture(scope="module")
def fit_result(name: str, case: Case, data: Any) -> tuple[Any, Any]:
    """(what `fit` returned, the estimator it was called on): one fit per regressor for the whole module."""
    model = regressor_class(name)(**case.settings)
    return case.fit(model, data), model


@pytest.fixture(scope="module")
def fitted(fit_result: tuple[Any, Any]) -> Any:
    return fit_result[1]


def _state(value: Any) -> Any:
    """A comparable copy of an estimator's state: boosters as their JSON, networks as their weights."""
    import xgboost as xgb

    if isinstance(value, xgb.Booster):
        return bytes(value.save_raw("json"))
    if isinstance(value, nn.Module):
        return {k: v.detach().numpy().tobytes() for k, v in value.state_dict().items()}
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, dict):
        return {k: _state(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_state(v) for v in value]
    if is_dataclass(value):
        return {f.name: _state(getattr(value, f.name)) for f in fields(value)}
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {k: _state(v) for k, v in vars(value).items()}
    return value


def test_init_stores_settings_only_and_get_params_round_trips(name, case, monkeypatch):
    cls = regressor_class(name)

    def no_io(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{name}.__init__ opened a file: {args[:1]}")

    with monkeypatch.context() as patch:
        for owner, attribute in ((builtins, "open"), (io, "open"), (os, "open"), (Path, "open")):
            patch.setattr(owner, attribute, no_io)
        model = cls(**case.settings)
    assert not [k for k in vars(model) if k.endswith("_")], "nothing is fitted by __init__"
    params = model.get_params()
    assert {k: params[k] for k in case.settings} == {k: list(v) if isinstance(v, tuple) else v
                                                     for k, v in case.settings.items()}
    assert cls(**params).get_params() == params


@pytest.mark.parametrize("name", [n for n in sorted(REGRESSORS) if CASES[n].learned], indirect=True)
def test_a_learned_regressor_refuses_to_predict_before_fit(name, case, data):
    with pytest.raises(PerfmodelError, match="fit"):
        case.predict(regressor_class(name)(**case.settings), data)


def test_fit_returns_self(fit_result):
    returned, model = fit_result
    assert returned is model


def test_predict_has_no_side_effects(fitted, case, data):
    before = _state(fitted)
    first, second = case.predict(fitted, data), case.predict(fitted, data)
    assert first.keys() == second.keys()
    n_rows = len(data[0]) if case.data in ("ops", "frame", "graph_frame") else len(data)
    for key, values in first.items():
        assert values.shape == (n_rows,), key
        np.testing.assert_array_equal(second[key], values, err_msg=key)
    assert _state(fitted) == before


def test_save_load_predicts_identically(name, fitted, case, data, tmp_path):
    written = Path(fitted.save(tmp_path / "model"))
    assert written.is_relative_to(tmp_path / "model")
    assert Manifest.read(tmp_path / "model").regressor == name
    expected = case.predict(fitted, data)
    for loaded in (type(fitted).load(tmp_path / "model"), load_regressor(tmp_path / "model")):
        assert type(loaded) is type(fitted)
        assert loaded.get_params() == fitted.get_params()
        for key, values in case.predict(loaded, data).items():
            np.testing.assert_array_equal(values, expected[key], err_msg=key)


def test_intervals_contain_the_median(fitted, case, data):
    low, median, high = case.interval(case.predict(fitted, data))
    assert np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(median > 0)
    assert np.all(low <= median) and np.all(median <= high)


def test_same_seed_same_data_same_predictions(name, fitted, case, data):
    again = case.fit(regressor_class(name)(**case.settings), data)
    expected = case.predict(fitted, data)
    for key, values in case.predict(again, data).items():
        np.testing.assert_array_equal(values, expected[key], err_msg=key)

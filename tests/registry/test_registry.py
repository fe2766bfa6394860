"""The registry and the predictor with a real (roofline) model: versions, promotion, predict from a graph alone."""

import functools
import json
import textwrap

import pytest
from typer.testing import CliRunner

from perfmodel.cli.main import app
from perfmodel.core.errors import PerfmodelError, UnknownNameError
from perfmodel.features.dataset import sample_for_prediction
from perfmodel.graph import capture_graph
from perfmodel.hardware.catalog import get_accelerator
from perfmodel.jobs.spec import JobSpec
from perfmodel.predictor import Predictor
from perfmodel.registry.registry import ModelRegistry, training_domain
from perfmodel.regressors import regressor_class

runner = CliRunner()


@pytest.fixture()
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFMODEL_MODELS_DIR", str(tmp_path / "models"))
    return ModelRegistry()


@functools.cache
def _graph(name):
    """One capture per zoo model for the whole module (graphs are frozen: sharing them is safe)."""
    return capture_graph(JobSpec.from_options(zoo=name, batch_size=2, seq_len=16))


def _samples(*names):
    hw = get_accelerator("cpu")
    out = []
    for name in names:
        spec = JobSpec.from_options(zoo=name, batch_size=2, seq_len=16)
        out.append(sample_for_prediction(spec, hw, graph=_graph(name)))
    return out


def test_versions_promotion_and_refusal_of_broken_artifacts(registry):
    samples = _samples("resnet18", "bert-small")
    model = regressor_class("roofline")().fit(samples)
    first = registry.save(model, "base", training_domain(samples))
    second = registry.save(model, "base", training_domain(samples))
    assert (first.ref, second.ref) == ("base/v1", "base/v2")
    with pytest.raises(PerfmodelError, match="no promoted model"):
        registry.get()
    registry.promote("base")  # a bare name is its newest version
    assert registry.get().ref == "base/v2" and registry.get("base/v1").ref == "base/v1"
    with pytest.raises(UnknownNameError):
        registry.get("bsae/v1")
    (first.path / "manifest.json").write_text("{broken")
    with pytest.raises(PerfmodelError):
        registry.promote("base/v1")
    assert registry.promoted_ref() == "base/v2"  # the old default keeps serving


def test_predict_from_graph_alone_with_breakdown_and_extrapolation(registry, tmp_path):
    samples = _samples("resnet18", "bert-small")
    registry.save(regressor_class("roofline")().fit(samples), "base", training_domain(samples))
    registry.promote("base/v1")
    predictor = Predictor.load()
    inside = predictor.predict(JobSpec.from_options(zoo="resnet18", batch_size=2), "cpu")
    assert inside.iter_time_ms > 0 and inside.model_version == "base/v1"
    assert sum(inside.breakdown_ms.values()) == pytest.approx(inside.iter_time_ms)
    assert inside.throughput_samples_per_s == pytest.approx(2 * 1000 / inside.iter_time_ms)
    assert inside.interval_ms[0] <= inside.iter_time_ms <= inside.interval_ms[1]
    assert inside.peak_memory_bytes > 0 and not inside.extrapolated
    # a module nobody profiled, at a batch size outside the training range: predicted, and flagged
    path = tmp_path / "net.py"
    path.write_text(textwrap.dedent("""
        import torch
        def make(batch_size):
            return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU()), torch.randn(batch_size, 32)
    """))
    unseen = predictor.predict(JobSpec.from_options(module=f"{path}:make", batch_size=64), "cpu")
    assert unseen.iter_time_ms > 0 and unseen.extrapolated
    assert any("batch size" in r for r in unseen.extrapolation_reasons)


def test_predict_cli_json(registry):
    samples = _samples("resnet18")
    registry.save(regressor_class("roofline")().fit(samples), "base", training_domain(samples))
    registry.promote("base/v1")
    result = runner.invoke(app, ["predict", "resnet18", "-b", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for field in ("iter_time_ms", "throughput_samples_per_s", "interval_ms", "breakdown_ms",
                  "peak_memory_bytes", "accelerator", "model_version", "extrapolated"):
        assert field in data
    assert set(data["breakdown_ms"]) == {"forward", "backward", "optimizer", "communication", "pipeline_bubble",
                                         "overhead"}
    bad = runner.invoke(app, ["predict", "resnet18", "--accelerator", "h1000"])
    assert bad.exit_code == 2 and "error:" in bad.stderr


def test_a_private_copy_of_the_shipped_models_never_writes_through_to_them(tmp_path):
    """`tests.conftest.copy_shipped_models` hard-links the boosters: promoting and saving new versions in the copy
    (what service tests do) leaves every shipped file as it was."""
    import hashlib

    from perfmodel.registry.registry import default_models_dir
    from tests.conftest import copy_shipped_models

    def digests(root):
        return {p.relative_to(root): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}

    shipped_root = default_models_dir()
    shipped = digests(shipped_root)
    copy = ModelRegistry(copy_shipped_models(tmp_path / "models"))
    assert digests(copy.root) == shipped
    boosters = [path for path in shipped if path.suffix == ".ubj"]
    assert boosters and all((copy.root / p).stat().st_ino == (shipped_root / p).stat().st_ino for p in boosters)
    assert (copy.root / "promoted.json").stat().st_ino != (shipped_root / "promoted.json").stat().st_ino
    samples = _samples("resnet18", "bert-small")
    saved = copy.save(regressor_class("roofline")().fit(samples), "xgb-ops", training_domain(samples))
    copy.promote(saved.ref, "cpu-step")
    copy.promote("xgb-device-ops/v2", "device-ops")
    assert copy.promoted_ref("cpu-step") == saved.ref != ModelRegistry(shipped_root).promoted_ref("cpu-step")
    assert digests(shipped_root) == shipped

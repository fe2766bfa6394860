from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.features.dataset import sample_for_prediction
from perfmodel.features.nodes import roofline_ms
from perfmodel.graph.from_torch import capture_graph
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import JobSpec, Precision
from perfmodel.regressors.manifest import Manifest
from perfmodel.regressors.roofline import RooflineRegressor

USER_MODELS = Path(__file__).parents[1] / "profilers" / "user_models.py"

HW = HardwareSpec(name="test-cpu", kind="cpu", peak_fp32_gflops=100.0, memory_bandwidth_gb_s=20.0, memory_gb=16.0,
                  compute_units=2, threads=2, source="test")
FAST = HW.model_copy(update={"peak_fp32_gflops": 1000.0, "memory_bandwidth_gb_s": 200.0})


def user_spec(name: str, batch_size: int = 4, **run) -> JobSpec:
    return JobSpec.from_options(module=f"{USER_MODELS}:{name}", batch_size=batch_size, **run)


@pytest.fixture(scope="module")
def samples():
    specs = [user_spec("tiny_cnn"), user_spec("tiny_mlp", optimizer="adam"), user_spec("tiny_mlp", mode="inference")]
    return [sample_for_prediction(spec, HW, graph=capture_graph(spec)) for spec in specs]


def test_prediction_is_the_sum_of_node_rooflines(samples):
    prediction = RooflineRegressor().predict(samples)
    train_cnn, train_mlp_adam, _inference = samples
    forward = sum(roofline_ms(n.flops_fwd, n.bytes_read_fwd + n.bytes_written_fwd, HW) for n in train_cnn.graph.nodes)
    backward = sum(roofline_ms(n.flops_bwd, n.bytes_read_bwd + n.bytes_written_bwd, HW)
                   for n in train_cnn.graph.nodes)
    assert prediction.forward_ms[0] == pytest.approx(forward) and prediction.backward_ms[0] == pytest.approx(backward)
    assert prediction.optimizer_ms[0] == pytest.approx(roofline_ms(0, 2 * train_cnn.graph.totals.param_bytes * 3, HW))
    assert prediction.optimizer_ms[1] == pytest.approx(
        roofline_ms(0, 2 * train_mlp_adam.graph.totals.param_bytes * 4, HW))
    assert prediction.backward_ms[2] == 0 and prediction.optimizer_ms[2] == 0 and prediction.forward_ms[2] > 0
    total = prediction.forward_ms + prediction.backward_ms + prediction.optimizer_ms + prediction.overhead_ms
    np.testing.assert_allclose(prediction.iter_time_ms, total)
    np.testing.assert_array_equal(prediction.p10_ms, prediction.iter_time_ms)
    np.testing.assert_array_equal(prediction.p90_ms, prediction.iter_time_ms)
    assert np.all(prediction.overhead_ms == 0) and np.all(prediction.iter_time_ms > 0)


def test_faster_hardware_predicts_faster(samples):
    slow = RooflineRegressor().predict(samples).iter_time_ms
    fast = RooflineRegressor().predict([dataclasses.replace(s, hardware=FAST) for s in samples]).iter_time_ms
    np.testing.assert_allclose(fast, slow / 10)


def test_half_precision_uses_the_fp16_peak(samples):
    gpu = HW.model_copy(update={"kind": "gpu", "peak_fp32_gflops": 1e-3, "peak_fp16_gflops": 1e6})
    fp32 = dataclasses.replace(samples[0], hardware=gpu)
    amp = dataclasses.replace(fp32, spec=fp32.spec.model_copy(update={"precision": Precision.amp}))
    prediction = RooflineRegressor().predict([fp32, amp])
    assert prediction.forward_ms[1] < prediction.forward_ms[0] / 100


def test_load_refuses_another_regressors_manifest(tmp_path):
    Manifest(regressor="xgb-ops", feature_names=("a",)).write(tmp_path)
    with pytest.raises(PerfmodelError, match="xgb-ops"):
        RooflineRegressor.load(tmp_path)

"""xgb-whole-step: the estimator contract, save/load, the calibrated interval, and physically possible answers when
the stage corrects composed predictions (properties over random jobs, GPUs, math modes and device counts)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.core.errors import PerfmodelError
from perfmodel.hardware.catalog import load_catalog
from perfmodel.jobs.spec import JobSpec, Precision
from perfmodel.placement.spec import Parallelism, PlacementSpec
from perfmodel.predictor.composition import COMPOSITION_FEATURES, SHARING_FEATURES
from perfmodel.predictor.placed import PlacementPredictor
from perfmodel.predictor.whole_step import WholeStepStage
from perfmodel.regressors import load_regressor
from perfmodel.regressors.whole_step import TARGET, WholeStepRegressor

FEATURES = ("a", "b", "roofline_over_composed")


def synthetic(n: int = 120, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"a": rng.uniform(0, 1, n), "b": rng.uniform(0, 1, n),
                          "roofline_over_composed": rng.uniform(0.1, 0.5, n)})
    frame[TARGET] = 0.4 * frame.a - 0.2 * frame.b + rng.normal(0, 0.03, n)
    return frame


def test_fit_returns_self_learns_and_predict_has_no_side_effects():
    frame = synthetic()
    groups = [f"family{i % 6}" for i in range(len(frame))]
    model = WholeStepRegressor(n_estimators=80, feature_names=FEATURES)
    assert model.fit(frame, groups=groups) is model
    before = frame.copy()
    out = model.predict(frame)
    pd.testing.assert_frame_equal(frame, before)
    assert np.mean(np.abs(out.log_factor - frame[TARGET])) < 0.08
    assert np.all(out.log_low <= out.log_factor) and np.all(out.log_factor <= out.log_high)
    assert model.predict(frame).log_factor.tolist() == out.log_factor.tolist()


def test_save_load_predicts_the_same(tmp_path):
    frame = synthetic()
    model = WholeStepRegressor(n_estimators=40, feature_names=FEATURES).fit(frame)
    model.save(tmp_path / "m")
    loaded = load_regressor(tmp_path / "m")
    assert isinstance(loaded, WholeStepRegressor) and loaded.feature_names == FEATURES
    a, b = model.predict(frame), loaded.predict(frame)
    np.testing.assert_allclose(a.log_factor, b.log_factor)
    np.testing.assert_allclose(a.log_high, b.log_high)


def test_missing_features_and_unfitted_models_are_clear_errors():
    with pytest.raises(PerfmodelError, match="not fitted"):
        WholeStepRegressor(feature_names=FEATURES).predict(synthetic())
    model = WholeStepRegressor(n_estimators=10, feature_names=FEATURES).fit(synthetic())
    with pytest.raises(PerfmodelError, match="missing"):
        model.predict(synthetic().drop(columns=["b"]))
    with pytest.raises(PerfmodelError, match="feature names"):
        WholeStepRegressor().fit(synthetic())


# --- the stage in the serving path -----------------------------------------------------------------------------

JOBS = {"resnet18": dict(zoo="resnet18", batch_size=16), "bert-small": dict(zoo="bert-small", batch_size=8,
                                                                           seq_len=64, optimizer="adamw")}
GPUS = sorted(name for name, spec in load_catalog().items() if spec.kind == "gpu")


class _Extreme:
    """A stand-in regressor answering a fixed, absurdly optimistic or pessimistic factor: the bounds must hold."""

    def __init__(self, log_factor: float):
        self.value = log_factor

    def predict(self, frame: pd.DataFrame):
        from perfmodel.regressors.whole_step import StepCorrection

        v = np.full(len(frame), self.value)
        return StepCorrection(v, v - 0.1, v + 0.1)


@pytest.fixture(scope="module")
def predictor():
    return PlacementPredictor.load()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(job=st.sampled_from(sorted(JOBS)), gpu=st.sampled_from(GPUS),
       precision=st.sampled_from([Precision.tf32, Precision.amp, Precision.fp32]),
       devices=st.sampled_from([2, 4, 8]), log_factor=st.sampled_from([-5.0, -0.3, 0.0, 0.4, 3.0]))
def test_a_corrected_step_never_beats_the_roofline_nor_linear_scaling(predictor, job, gpu, precision, devices,
                                                                       log_factor):
    spec = JobSpec.from_options(**{**JOBS[job], "precision": precision.value})
    one = PlacementSpec(accelerator=gpu, devices_per_node=(1,), global_batch_size=spec.batch_size)
    many = PlacementSpec(accelerator=gpu, devices_per_node=(devices,), global_batch_size=spec.batch_size * devices,
                         parallelism=Parallelism(data=devices))
    predictor.set_whole_step(WholeStepStage(_Extreme(log_factor), "test/v1"))
    try:
        single, placed = predictor.predict(spec, one), predictor.predict(spec, many)
        features = predictor.composition(spec, one)
    finally:
        predictor.set_whole_step(None)
    composed = predictor.predict(spec, one)
    # never faster than every kernel at the peak of its math or the bandwidth
    floor_ms = features["roofline_over_composed"] * composed.iter_time_ms
    assert single.iter_time_ms >= floor_ms * (1 - 1e-9)
    assert single.iter_time_ms == pytest.approx(sum(single.breakdown_ms.values()))
    assert single.interval_ms[0] <= single.iter_time_ms * (1 + 1e-9)
    assert single.iter_time_ms <= single.interval_ms[1] * (1 + 1e-9)
    # n devices never beat n times one device
    assert placed.throughput_samples_per_s <= devices * single.throughput_samples_per_s * (1 + 1e-9)


def test_features_are_named_and_finite_where_the_spec_sheet_has_them(predictor):
    spec = JobSpec.from_options(zoo="resnet18", batch_size=8, precision="amp")
    features = predictor.composition(spec, PlacementSpec(accelerator="a100", devices_per_node=(1,),
                                                         global_batch_size=8))
    assert tuple(features) == (*COMPOSITION_FEATURES, *SHARING_FEATURES)  # the stage's, then the co-location's
    assert all(np.isfinite(v) for v in features.values())
    assert 0 < features["sm_fill"] <= 1 and 0 < features["bandwidth_share"] <= 1
    assert features["amp"] == 1.0 and 0 < features["roofline_over_composed"] <= 1.0
    assert sum(features[f"share_{g}"] for g in ("matmul", "conv", "autocast_fp32", "vector", "optimizer")) == \
        pytest.approx(1.0)

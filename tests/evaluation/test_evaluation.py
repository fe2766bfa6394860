from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.evaluation import HeldOutPrediction, error_metrics, evaluate, write_report
from perfmodel.features.dataset import sample_for_prediction
from perfmodel.graph.from_torch import capture_graph
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import JobSpec
from perfmodel.regressors.base import IterationPrediction
from perfmodel.regressors.roofline import RooflineRegressor

USER_MODELS = Path(__file__).parents[1] / "profilers" / "user_models.py"
HW = HardwareSpec(name="test-cpu", kind="cpu", peak_fp32_gflops=100.0, memory_bandwidth_gb_s=20.0, memory_gb=16.0,
                  compute_units=2, threads=2, source="test")
FAMILIES = ("cnn", "mlp", "rnn", "vit", "bert")


@pytest.fixture(scope="module")
def samples():
    """20 measured samples over 5 families, from two real tiny graphs; measured = roofline × a family factor."""
    base = []
    for name in ("tiny_cnn", "tiny_mlp"):
        for batch in (2, 4):
            spec = JobSpec.from_options(module=f"{USER_MODELS}:{name}", batch_size=batch)
            base.append(sample_for_prediction(spec, HW, graph=capture_graph(spec)))
    roofline = RooflineRegressor().predict(base).iter_time_ms
    out = []
    for i, family in enumerate(FAMILIES):
        for j, sample in enumerate(base):
            out.append(dataclasses.replace(sample, family=family, iter_time_ms=float(roofline[j] * (20 + 5 * i)),
                                           iter_time_cv=0.01 * (1 + i), profile_id=len(out)))
    return out


class ScaledRoofline:
    """Learns the mean measured / roofline ratio; interval ±30 %. Records the families it was fitted on."""

    name = "scaled"
    fitted_families: ClassVar[list[set[str]]] = []

    def __init__(self) -> None:
        self.scale = 1.0

    def fit(self, samples):
        roofline = RooflineRegressor().predict(samples).iter_time_ms
        ratio = [s.iter_time_ms / r for s, r in zip(samples, roofline)]
        self.scale = float(np.mean(ratio))
        ScaledRoofline.fitted_families.append({s.family for s in samples})
        return self

    def predict(self, samples):
        base = RooflineRegressor().predict(samples)
        scaled = {f.name: getattr(base, f.name) * self.scale for f in dataclasses.fields(base)}
        scaled["p10_ms"] = scaled["iter_time_ms"] * 0.7
        scaled["p90_ms"] = scaled["iter_time_ms"] * 1.3
        return IterationPrediction(**scaled)


def test_every_sample_is_held_out_once_per_regressor_and_never_trained_on(samples):
    ScaledRoofline.fitted_families = []
    result = evaluate({"roofline": RooflineRegressor, "scaled": ScaledRoofline}, samples, k=5, seed=0)
    assert result.regressors == ("roofline", "scaled") and result.folds == 5
    for name in result.regressors:
        rows = [p for p in result.predictions if p.regressor == name]
        assert sorted(p.profile_id for p in rows) == list(range(len(samples)))
    for fold, trained_on in enumerate(ScaledRoofline.fitted_families):
        held_out = {p.family for p in result.predictions if p.fold == fold}
        assert not trained_on & held_out and trained_on | held_out == set(FAMILIES)


def test_metrics_read_the_way_they_should(samples):
    result = evaluate({"roofline": RooflineRegressor, "scaled": ScaledRoofline}, samples, k=5)
    roofline, scaled = result.overall_for("roofline"), result.overall_for("scaled")
    assert roofline.samples == scaled.samples == len(samples)
    assert roofline.median_ratio < 0.1 and roofline.interval_coverage == 0.0  # a point estimate, far too fast
    assert scaled.mape_pct < roofline.mape_pct and 0 < scaled.interval_coverage <= 1
    assert result.worst_family("scaled").family in ("cnn", "bert")  # the extreme factors
    assert set(result.family_metrics("roofline")) == set(FAMILIES)
    assert result.noise_median_cv_pct == pytest.approx(3.0)
    assert evaluate({"scaled": ScaledRoofline}, samples, k=5).overall == (scaled,)  # deterministic


def test_error_metrics_by_hand():
    rows = [HeldOutPrediction(regressor="r", fold=0, family="f", job_name="j", profile_id=i, measured_ms=100.0,
                              predicted_ms=predicted, p10_ms=90.0, p90_ms=110.0, measured_cv=cv)
            for i, (predicted, cv) in enumerate(((100.0, 0.02), (110.0, None), (50.0, 0.04), (200.0, 0.06)))]
    m = error_metrics(rows)
    assert m.samples == 4 and m.mape_pct == pytest.approx((0 + 10 + 50 + 100) / 4)
    assert m.median_ape_pct == pytest.approx(30.0) and m.p90_ape_pct == pytest.approx(85.0)
    assert m.interval_coverage == 1.0  # the measured 100 ms is inside [90, 110] every time
    assert m.median_ratio == pytest.approx(1.05) and m.median_cv_pct == pytest.approx(4.0)


def test_unmeasured_samples_are_refused(samples):
    with pytest.raises(PerfmodelError, match="no measured iteration time"):
        evaluate({"roofline": RooflineRegressor}, [*samples, dataclasses.replace(samples[0], iter_time_ms=None)])


def test_report_files_are_written(samples, tmp_path):
    result = evaluate({"roofline": RooflineRegressor, "scaled": ScaledRoofline}, samples, k=3)
    paths = write_report(result, tmp_path / "report")
    assert set(paths) == {"report", "predictions", "scatter", "families"}
    for kind in ("scatter", "families"):
        assert paths[kind].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = paths["report"].read_text()
    assert "| regressor | samples | MAPE |" in report and "| scaled |" in report and "| roofline |" in report
    assert "Measurement noise" in report and "3.0 %" in report and "How it was computed" in report
    assert all(f"| {family} |" in report for family in FAMILIES)
    lines = paths["predictions"].read_text().splitlines()
    assert lines[0].startswith("regressor,fold,family") and len(lines) == 1 + 2 * len(samples)

"""Calibration by reported throughput cannot be poisoned: physics refuses the impossible, robust statistics
ignore the outlier, old points fade, device counts that differ get their own factor."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.calibration.job import (
    HALF_LIFE_DAYS,
    ObservationRefused,
    ObservedPoint,
    calibrate,
    ceiling_samples_per_s,
    check_observation,
    flops_per_sample,
    weighted_median,
)
from perfmodel.graph import graph_for_job
from perfmodel.hardware.catalog import load_catalog
from perfmodel.jobs.spec import JobSpec
from perfmodel.placement.spec import PlacementSpec

NOW = datetime(2026, 11, 22, tzinfo=timezone.utc)


def _point(i: int, ratio: float, accelerator: str = "a100-sxm4-80gb", devices: int = 1, days_ago: float = 0.0,
           predicted: float = 400.0) -> ObservedPoint:
    return ObservedPoint(i, accelerator, devices, predicted * ratio, predicted, NOW - timedelta(days=days_ago))


@pytest.fixture(scope="module")
def resnet50():
    spec = JobSpec.from_options(zoo="resnet50", batch_size=32)
    return spec, graph_for_job(spec)


def test_the_issue_probe_1e12_samples_per_s_on_one_a100_is_refused_by_physics(resnet50):
    spec, graph = resnet50
    placement = PlacementSpec(accelerator="a100-sxm4-80gb", global_batch_size=32)
    ceiling = ceiling_samples_per_s(spec, graph, placement, load_catalog())
    # ResNet-50 training is ~24.6 GFLOP per 224x224 sample (3 x 4.1 GMACs x 2); an A100's fastest math here is TF32
    assert flops_per_sample(spec, graph) == pytest.approx(3 * 2 * 4.1e9, rel=0.1)
    assert 1_000 < ceiling < 20_000
    with pytest.raises(ObservationRefused, match="physically"):
        check_observation(1e12, ceiling_samples_per_s=ceiling, predicted_samples_per_s=402.0)
    eight = placement.model_copy(update={"devices_per_node": (8,), "global_batch_size": 256})
    assert ceiling_samples_per_s(spec, graph, eight, load_catalog()) == pytest.approx(8 * ceiling)
    check_observation(1_200.0, ceiling_samples_per_s=ceiling, predicted_samples_per_s=402.0)  # fast but possible


def test_a_cpus_ceiling_allows_headroom_over_its_probed_gemm_rate(resnet50):
    """A CPU entry's fp32 figure is a GEMM probe of one host, not a peak, and `cpu` answers for any host: its
    ceiling is `CPU_PROBE_HEADROOM` times what that rate gives; a GPU's is its spec-sheet peak's."""
    from perfmodel.calibration.job import CPU_PROBE_HEADROOM
    from perfmodel.core import cost

    spec, graph = resnet50
    catalog = load_catalog()
    cpu = PlacementSpec(accelerator="cpu", global_batch_size=32)
    at_probe = 1e3 / cost.compute_ms(flops_per_sample(spec, graph), catalog["cpu"].peak_fp32_gflops)
    assert ceiling_samples_per_s(spec, graph, cpu, catalog) == pytest.approx(CPU_PROBE_HEADROOM * at_probe)
    assert CPU_PROBE_HEADROOM > 1


@pytest.mark.parametrize("value", [0.0, -5.0, math.inf, math.nan, 1.0])
def test_non_positive_non_finite_and_absurdly_low_reports_are_refused(value):
    with pytest.raises(ObservationRefused):
        check_observation(value, ceiling_samples_per_s=1e4, predicted_samples_per_s=402.0)


@settings(max_examples=200, deadline=None)
@given(good=st.lists(st.floats(0.7, 1.4), min_size=3, max_size=30), bad=st.floats(1e-2, 1e6))
def test_one_poisoned_point_among_three_or_more_moves_the_factor_at_most_to_the_good_points_range(good, bad):
    points = [_point(i, r) for i, r in enumerate(good)] + [_point(len(good), bad)]
    factor, _ = calibrate(points, now=NOW).factor("a100-sxm4-80gb", 1)
    assert min(good) * (1 - 1e-9) <= factor <= max(good) * (1 + 1e-9)


def test_the_outlier_is_excluded_and_the_report_says_why():
    points = [_point(1, 1.10), _point(2, 1.12), _point(3, 1.08), _point(4, 2.5e9)]
    calibration = calibrate(points, now=NOW)
    factor, used = calibration.factor("a100-sxm4-80gb", 1)
    assert factor == pytest.approx(1.10, rel=0.02) and used == 3
    report = calibration.report()
    assert [e["id"] for e in report["excluded"]] == [4] and "outlier" in report["excluded"][0]["reason"]
    assert report["observations"] == 4 and report["used"] == 3
    assert report["mape_calibrated_pct"] < report["mape_uncalibrated_pct"]


def test_recent_points_outweigh_old_ones():
    old = [_point(i, 2.0, days_ago=10 * HALF_LIFE_DAYS) for i in range(3)]
    new = [_point(10 + i, 1.0, days_ago=1) for i in range(2)]
    factor, _ = calibrate(old + new, now=NOW).factor("a100-sxm4-80gb", 1)
    assert factor == pytest.approx(1.0)
    unweighted, _ = calibrate(old + new).factor("a100-sxm4-80gb", 1)
    assert unweighted == pytest.approx(2.0)  # without a clock the majority wins


def test_a_device_count_that_differs_gets_its_own_factor_and_others_the_pooled_one():
    one = [_point(i, 1.0, devices=1) for i in range(3)]
    eight = [_point(10 + i, 0.6, devices=8) for i in range(3)]
    calibration = calibrate(one + eight, now=NOW)
    assert calibration.factor("a100-sxm4-80gb", 8)[0] == pytest.approx(0.6)
    assert calibration.factor("a100-sxm4-80gb", 1)[0] == pytest.approx(1.0)
    assert calibration.factor("a100-sxm4-80gb", 4)[1] == 6  # no points of its own: the accelerator's
    assert calibration.factor("v100-sxm2-32gb", 1) == (1.0, 0)


def test_a_job_reported_at_one_and_at_eight_devices_is_answered_by_each_report_there():
    """One report at 1 GPU (3x the model) and one at 8 (1/8 of it): each device count gets its own report, not the
    newest one, and a device count never reported gets the two pooled (halfway, in log)."""
    for order in ((0, 1), (1, 0)):
        reports = [_point(1, 3.0, devices=1), _point(2, 0.125, devices=8)]
        calibration = calibrate([reports[i] for i in order], now=NOW)
        assert calibration.factor("a100-sxm4-80gb", 1)[0] == pytest.approx(3.0)
        assert calibration.factor("a100-sxm4-80gb", 8)[0] == pytest.approx(0.125)
        assert calibration.factor("a100-sxm4-80gb", 4)[0] == pytest.approx(math.sqrt(3.0 * 0.125), rel=1e-3)


def test_weighted_median():
    assert weighted_median([1, 2, 3], [1, 1, 1]) == 2
    assert weighted_median([1, 2], [1, 1]) == 1.5
    assert 1 < weighted_median([1, 2, 3], [10, 1, 1]) < 1.25  # most of the weight on 1: most of the way there
    # two reports minutes apart weigh the same: their mean, whichever came last
    assert weighted_median([0.0, 1.0], [1.0, 0.99999]) == pytest.approx(0.5, abs=1e-4)
    assert weighted_median([0.0, 1.0], [0.99999, 1.0]) == pytest.approx(0.5, abs=1e-4)


def test_steps_per_s_posted_as_samples_per_s_is_refused_and_a_slow_job_is_not():
    """Gavel's tables are in steps/s: ResNet-50 at batch 64 on a K80 die runs ~0.75 steps/s, ~48 samples/s. Posted as
    samples/s, the value times the batch lands on the model's answer, and it is refused with the unit named."""
    with pytest.raises(ObservationRefused, match="steps/s"):
        check_observation(0.746, ceiling_samples_per_s=1e4, predicted_samples_per_s=71.8, samples_per_step=64)
    # the same report as samples/s passes, as does a job 3x slower than the model, and a small batch is not judged
    check_observation(47.7, ceiling_samples_per_s=1e4, predicted_samples_per_s=71.8, samples_per_step=64)
    check_observation(24.0, ceiling_samples_per_s=1e4, predicted_samples_per_s=71.8, samples_per_step=64)
    check_observation(9.0, ceiling_samples_per_s=1e4, predicted_samples_per_s=71.8, samples_per_step=8)
    # 64x below the model with batch 64 reads as steps/s; 4x below does not, however large the batch
    with pytest.raises(ObservationRefused, match="per-device batch"):
        check_observation(402.0 / 64, ceiling_samples_per_s=1e4, predicted_samples_per_s=402.0, samples_per_step=64)
    check_observation(100.0, ceiling_samples_per_s=1e4, predicted_samples_per_s=402.0, samples_per_step=4096)


def test_a_jobs_spread_there_says_how_sure_its_next_run_is():
    """One report: one run's noise (and its median's, as much again); consistent reports: their small spread, at
    least ~5 %; reports far apart: wider. None where the job never ran."""
    one = calibrate([_point(1, 0.8)], now=NOW)
    assert one.log_sigma("a100-sxm4-80gb") == pytest.approx(0.17 * math.sqrt(2))
    agree = calibrate([_point(i, r) for i, r in enumerate((0.80, 0.81, 0.79, 0.80))], now=NOW)
    apart = calibrate([_point(i, r) for i, r in enumerate((0.6, 0.8, 1.0, 1.2))], now=NOW)
    assert agree.log_sigma("a100-sxm4-80gb") == pytest.approx(0.05 * math.sqrt(1.25))
    assert apart.log_sigma("a100-sxm4-80gb") > 3 * agree.log_sigma("a100-sxm4-80gb")
    assert agree.log_sigma("v100-sxm2-32gb") is None

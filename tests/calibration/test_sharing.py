"""A job's reports while sharing: the factor they give (the mean log ratio, shrunk toward 1), where it applies, and
that the calibrated pair stays physically possible over random jobs and factors."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.calibration.sharing import (
    MAX_SHARED_POINTS,
    SHARING_PRIOR_OBSERVATIONS,
    SharedPoint,
    calibrate_sharing,
    calibrated_steps,
    reported_band,
    sharing_factor,
)
from perfmodel.placement.colocation import SharingJob, combined_device_share, share


def test_no_report_is_no_calibration_and_reports_give_their_mean_shrunk_toward_one():
    assert sharing_factor([]).as_dict() == {"level": "none", "factor": 1.0, "observations": 0, "partners": 0}
    one = sharing_factor([math.log(0.5)])
    assert one.level == "job" and one.observations == 1
    assert one.factor == pytest.approx(0.5 ** (1 / (1 + SHARING_PRIOR_OBSERVATIONS)))
    assert 0.5 < one.factor < 0.6  # most of the way to what it saw, not past it
    three = sharing_factor([math.log(0.5), math.log(0.8), math.log(0.6)], partners=2)
    assert three.factor == pytest.approx(math.exp(math.log(0.24) / (3 + SHARING_PRIOR_OBSERVATIONS)))
    assert three.partners == 2
    assert sharing_factor([math.log(2.0)], prior_observations=0.0).factor == pytest.approx(2.0)


def test_reports_apply_to_their_accelerator_and_mode_only_and_the_newest_count():
    points = [SharedPoint(i, "t4", "time-slicing", f"partner{i % 3}", math.log(0.5)) for i in range(1, 5)]
    points += [SharedPoint(10, "a10", "time-slicing", "partner0", math.log(2.0)),
               SharedPoint(11, "t4", "mps", "partner0", math.log(2.0))]
    calibration = calibrate_sharing(reversed(points))
    t4 = calibration.applied("t4", "time-slicing")
    assert (t4.observations, t4.partners) == (4, 3) and t4.factor < 0.6
    assert calibration.applied("a10", "time-slicing").factor > 1.5
    assert calibration.applied("t4", "mps").observations == 1
    assert calibration.applied("h100-sxm5-80gb", "time-slicing").level == "none"
    many = calibrate_sharing([SharedPoint(i, "t4", "mps", "p", math.log(2.0 if i > 100 else 0.5))
                              for i in range(1, 101 + MAX_SHARED_POINTS)])
    assert many.applied("t4", "mps").observations == MAX_SHARED_POINTS
    assert many.applied("t4", "mps").factor > 1.5  # the newest reports only


def test_the_band_after_reports_widens_where_the_jobs_own_reports_disagree():
    band = (-0.2, 0.2)
    assert reported_band(band, sharing_factor([math.log(0.5)])) == band  # one report: no spread to speak of
    agreeing = sharing_factor([math.log(0.5), math.log(0.52), math.log(0.49)])
    assert reported_band(band, agreeing) == band
    disagreeing = sharing_factor([math.log(0.3), math.log(0.9)])
    low, high = reported_band(band, disagreeing)
    assert low < -0.2 and high > 0.2 and low == pytest.approx(-high)
    assert high == pytest.approx(1.2815515655446004 * disagreeing.log_spread * math.sqrt(1.5))


job = st.builds(SharingJob, st.floats(0.0, 500.0), st.floats(0.0, 500.0)).filter(lambda j: j.step_ms > 0.01)


@settings(max_examples=300, deadline=None)
@given(a=job, b=job, factors=st.tuples(st.floats(0.1, 10.0), st.floats(0.1, 10.0)),
       sharing=st.sampled_from(["time-slicing", "mps"]))
def test_a_calibrated_pair_is_never_faster_than_alone_nor_more_than_the_device(a, b, factors, sharing):
    shared = share(a, b, sharing)
    steps = calibrated_steps((a, b), shared.step_ms, factors)
    for job_, step in zip((a, b), steps):
        assert step >= job_.step_ms * (1 - 1e-12)
    assert combined_device_share((a, b), steps) <= 1 + 1e-9
    unchanged = calibrated_steps((a, b), shared.step_ms, (1.0, 1.0))
    assert unchanged == pytest.approx(list(shared.step_ms))

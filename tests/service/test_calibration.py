import math

import pytest

from service.calibration import ObservedPoint, factors, leave_one_out, mape_pct


def _point(i, acc, observed, predicted=100.0):
    return ObservedPoint(i, acc, observed, predicted)


def test_the_factor_is_the_geometric_mean_of_observed_over_predicted_per_accelerator():
    points = [_point(1, "t4", 50.0), _point(2, "t4", 200.0), _point(3, "v100", 80.0)]
    got = factors(points)
    assert got["t4"] == (pytest.approx(1.0), 2)  # sqrt(0.5 × 2)
    assert got["v100"] == (pytest.approx(0.8), 1)
    assert factors([]) == {}


def test_leave_one_out_never_uses_the_point_itself():
    points = [_point(1, "t4", 50.0), _point(2, "t4", 60.0, predicted=120.0), _point(3, "v100", 80.0)]
    loo = leave_one_out(points)
    assert loo[0] == pytest.approx(100.0 * 0.5)  # calibrated by point 2's ratio alone (60/120)
    assert loo[1] == pytest.approx(120.0 * 0.5)  # by point 1's (50/100)
    assert loo[2] == pytest.approx(100.0)  # alone on its accelerator: uncalibrated
    assert mape_pct(loo, [50.0, 60.0, 80.0]) == pytest.approx(100 * (0 + 0 + 0.25) / 3)
    assert mape_pct([], []) is None
    assert math.isclose(mape_pct([110.0], [100.0]), 10.0)

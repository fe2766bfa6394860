"""The co-location model's invariants on random pairs of jobs and constants (no predictor needed)."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.placement.colocation import (
    SHARING_MODES,
    ColocationParams,
    SharingJob,
    combined_device_share,
    load_colocation_params,
    share,
    shared_interval,
)

RNG = np.random.default_rng(11)


def random_job() -> SharingJob:
    return SharingJob(device_ms=float(RNG.uniform(0.1, 500)), host_ms=float(RNG.choice([0.0, RNG.uniform(0, 300)])))


@pytest.mark.parametrize("sharing", SHARING_MODES)
def test_no_job_beats_its_isolated_step_and_the_pair_never_exceeds_the_device(sharing):
    for _ in range(300):
        a, b = random_job(), random_job()
        params = ColocationParams(switch_overhead=float(RNG.uniform(0, 1.5)),
                                  sync_wait_ms=float(RNG.choice([0.0, RNG.uniform(0, 80)])))
        shared = share(a, b, sharing, params)
        assert shared.step_ms[0] >= a.step_ms * (1 - 1e-12) and shared.step_ms[1] >= b.step_ms * (1 - 1e-12)
        assert shared.combined_device_share <= 1 + 1e-9


def test_a_short_step_job_waits_its_turn_and_its_long_step_partner_barely_notices():
    """Time-slicing with a wait per step: a 5 ms job next to a 400 ms one loses most of its speed, the 400 ms job
    little (the more the short job waits, the less it holds the device); MPS (kernels of both at once) has no turns
    to wait."""
    short, long = SharingJob(5.0, 0.0), SharingJob(400.0, 0.0)
    params = ColocationParams(sync_wait_ms=40.0)
    shared = share(short, long, "time-slicing", params)
    kept = [alone.step_ms / step for alone, step in zip((short, long), shared.step_ms)]
    assert kept[0] < 0.15 and kept[1] > 0.8
    no_wait = share(short, long, "time-slicing", ColocationParams())
    assert shared.step_ms[0] > no_wait.step_ms[0] + 30
    assert share(short, long, "mps", params).step_ms == share(short, long, "mps", ColocationParams()).step_ms


@pytest.mark.parametrize("host_ms", [0.0, 5.0])
def test_under_mps_two_device_bound_jobs_together_get_at_most_the_device(host_ms):
    """A training step's kernels fill the device's SMs while they run: two jobs that keep the device busy share it
    (together at most one job's throughput), whatever share of the peak FLOP/s their kernels reach; jobs with host
    gaps fill each other's."""
    for _ in range(200):
        a, b = SharingJob(float(RNG.uniform(1, 300)), host_ms), SharingJob(float(RNG.uniform(1, 300)), host_ms)
        shared = share(a, b, "mps")
        kept = sum(alone.step_ms / step for alone, step in zip((a, b), shared.step_ms))
        assert kept <= 1 + 1e-9 if host_ms == 0 else 1 < kept <= 2
        assert shared.combined_device_share <= 1 + 1e-9


def random_share() -> float:
    return float(RNG.choice([1.0, RNG.uniform(0.01, 1.0)]))


@pytest.mark.parametrize("sharing", SHARING_MODES)
def test_with_any_sm_fill_and_bandwidth_no_job_beats_alone_and_the_pair_never_holds_more_than_the_device(sharing):
    for _ in range(300):
        a, b = random_job(), random_job()
        a, b = (SharingJob(job.device_ms, job.host_ms, random_share(), random_share()) for job in (a, b))
        shared = share(a, b, sharing, ColocationParams(sync_wait_ms=float(RNG.uniform(0, 40))))
        assert shared.step_ms[0] >= a.step_ms * (1 - 1e-12) and shared.step_ms[1] >= b.step_ms * (1 - 1e-12)
        assert shared.combined_device_share <= 1 + 1e-9
        assert shared.combined_device_share == pytest.approx(combined_device_share((a, b), shared.step_ms, sharing))
        # what the pair holds of each resource per second: each job's kernel time over its step, times its share
        # of the SMs (of the bandwidth) under MPS, all of the device under time-slicing
        for resource in ("sm_fill", "bandwidth_share"):
            held = sum((getattr(job, resource) if sharing == "mps" else 1.0) * job.device_ms / step
                       for job, step in zip((a, b), shared.step_ms))
            assert held <= 1 + 1e-9


def test_under_mps_kernels_that_leave_the_device_room_run_side_by_side_and_beyond_it_share_it_in_proportion():
    """Two busy jobs (no host time) whose kernels hold fill_a and fill_b of the SMs and draw bw_a and bw_b of the
    memory bandwidth: each keeps its step alone while both sums stay within the device, else each runs at
    1 / (the larger sum) of its speed (half at the most)."""
    for _ in range(300):
        fills, bandwidth = RNG.uniform(0.01, 1.0, 2), RNG.uniform(0.01, 1.0, 2)
        a, b = (SharingJob(float(RNG.uniform(1, 300)), 0.0, float(fills[i]), float(bandwidth[i])) for i in (0, 1))
        shared = share(a, b, "mps")
        slowdown = max(1.0, fills.sum(), bandwidth.sum())
        assert shared.step_ms[0] == pytest.approx(a.step_ms * slowdown)
        assert shared.step_ms[1] == pytest.approx(b.step_ms * slowdown)
        # a partner that holds more of the device never leaves a job faster
        for more in (SharingJob(b.device_ms, 0.0, min(1.0, b.sm_fill * 1.5), b.bandwidth_share),
                     SharingJob(b.device_ms, 0.0, b.sm_fill, min(1.0, b.bandwidth_share * 1.5))):
            assert share(a, more, "mps").step_ms[0] >= shared.step_ms[0] * (1 - 1e-12)
    # kernels that fill the device: half speed each, as two jobs that keep it busy
    full = share(SharingJob(50.0, 0.0), SharingJob(80.0, 0.0), "mps")
    assert full.step_ms == pytest.approx((100.0, 160.0))


def test_time_slicing_runs_one_job_at_a_time_whatever_its_kernels_hold():
    for _ in range(100):
        a, b = random_job(), random_job()
        params = ColocationParams(switch_overhead=float(RNG.uniform(0, 0.5)), sync_wait_ms=float(RNG.uniform(0, 40)))
        small = [SharingJob(job.device_ms, job.host_ms, float(RNG.uniform(0.01, 0.3)), float(RNG.uniform(0.01, 0.3)))
                 for job in (a, b)]
        assert share(small[0], small[1], "time-slicing", params) == share(a, b, "time-slicing", params)


def test_a_shared_answers_interval_holds_it_widens_with_the_band_and_never_tops_the_isolated_one():
    for _ in range(500):
        alone = float(RNG.uniform(1, 1e4))
        low_alone, high_alone = alone * float(RNG.uniform(0.3, 1.0)), alone * float(RNG.uniform(1.0, 3.0))
        slowdown = float(RNG.uniform(1.0, 10.0))
        point = alone / slowdown
        band = (-float(RNG.uniform(0, 1)), float(RNG.uniform(0, 1)))
        low, high = shared_interval(point, (low_alone, high_alone), slowdown, band)
        assert low <= point <= high <= high_alone * (1 + 1e-12)
        wider = (band[0] - 0.2, band[1] + 0.2)
        wider_low, wider_high = shared_interval(point, (low_alone, high_alone), slowdown, wider)
        assert wider_low <= low and wider_high >= high
        # no band: the isolated interval over the slowdown (capped at the isolated top)
        plain = shared_interval(point, (low_alone, high_alone), slowdown, (0.0, 0.0))
        assert plain == pytest.approx((low_alone / slowdown, min(high_alone / slowdown, high_alone)))


def test_the_band_after_reports_is_the_row_of_the_most_reports_at_most_that_many():
    params = ColocationParams(reported_band_log=((1, -0.3, 0.2), (2, -0.2, 0.15), (4, -0.1, 0.1)))
    assert params.reported_band(0) is None
    assert params.reported_band(1) == (-0.3, 0.2)
    assert params.reported_band(3) == (-0.2, 0.15)
    assert params.reported_band(40) == (-0.1, 0.1)
    assert ColocationParams().reported_band(5) is None
    assert ColocationParams.from_dict({"reported_band_log": [[1, -0.3, 0.2]]}).reported_band(2) == (-0.3, 0.2)
    for preemption in ("instruction", "thread-block"):
        shipped = load_colocation_params(preemption=preemption)
        widths = []
        for k in (1, 2, 4):
            low, high = shipped.reported_band(k)
            assert low < 0 < high
            widths.append(high - low)
        assert widths == sorted(widths, reverse=True)  # more reports, a narrower band


def test_constants_follow_how_the_gpu_preempts_compute():
    from perfmodel.placement.colocation import preemption_of

    assert [preemption_of(a) for a in ("kepler", "Maxwell", "pascal", "volta", "hopper", None)] == [
        "thread-block", "thread-block", "instruction", "instruction", "instruction", "instruction"]
    kepler, pascal = (load_colocation_params(preemption=p) for p in ("thread-block", "instruction"))
    assert kepler != pascal and kepler.sync_wait_ms > pascal.sync_wait_ms  # a slice ends when the blocks drain
    assert load_colocation_params() == pascal  # what a GPU of unknown architecture gets

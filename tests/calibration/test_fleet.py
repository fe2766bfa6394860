"""Fleet calibration: evidence shared across jobs, SKUs of a chip and device counts, shrunk toward the model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.calibration.fleet import NONE, FleetPoint, FleetQuery, fit_fleet

A100 = {"accelerator": "a100-sxm4-80gb", "chip": "GA100", "architecture": "ampere", "precision": "tf32"}
A100_PCIE = {**A100, "accelerator": "a100-pcie-40gb"}
V100 = {"accelerator": "v100-sxm2-32gb", "chip": "GV100", "architecture": "volta", "precision": "tf32"}


def points(ratio: float, jobs: int, where: dict[str, str] = A100, *, per_job: int = 1, start: int = 0,
           prefix: str = "job", communication_share: float = 0.0) -> list[FleetPoint]:
    """`per_job` observations of each of `jobs` jobs, each `ratio` times slower than predicted."""
    return [FleetPoint(start + i * per_job + k, f"{prefix}{i}", **where, log_ratio=math.log(ratio),
                       communication_share=communication_share)
            for i in range(jobs) for k in range(per_job)]


def ask(fleet, job: str = "new", where: dict[str, str] = A100, communication_share: float = 0.0):
    return fleet.apply(FleetQuery(job, **where, communication_share=communication_share))


def test_no_evidence_changes_nothing():
    assert fit_fleet([]).apply(FleetQuery("x", **A100)) == NONE
    fleet = fit_fleet(points(2.0, 3))
    assert ask(fleet, where=V100) == NONE  # another chip, no evidence


def test_other_jobs_on_an_accelerator_correct_a_new_job_more_with_more_jobs_and_never_past_them():
    factors = []
    for jobs in (1, 2, 4, 8, 16):
        applied = ask(fit_fleet(points(1.5, jobs)))  # every observed job runs 1.5x slower than predicted
        assert applied.level == "accelerator" and applied.jobs == jobs and applied.observations == jobs
        assert 1 / 1.5 < applied.throughput_factor < 1
        factors.append(applied.throughput_factor)
    assert factors == sorted(factors, reverse=True)  # more agreeing jobs: closer to what they show
    # one other job moves the next about half-way, not all of it (a job's own error may be as wide as a device's) ...
    assert 1 / 1.5 ** 0.7 < factors[0] < 1 / 1.5 ** 0.4
    # ... and sixteen that agree move it nearly all the way: a device the model is off on is learned
    assert factors[-1] < 1 / 1.5 ** 0.9


def test_a_job_observed_elsewhere_carries_to_other_accelerators_most_where_other_jobs_pin_the_device():
    """A job 1.5x slower than the model on one GPU: where other jobs ran as the model says there (the device is
    pinned), its error is its own and carries to another GPU of the same generation further than one other job's
    observation carries to a new job on that GPU; across generations less (it may be the job's on that generation);
    alone on its GPU, it may be the device's, and carries least."""
    others = ask(fit_fleet(points(1.5, 1)))
    a10 = {**A100, "accelerator": "a10", "chip": "GA102"}
    pinned = points(1.0, 3, a10, prefix="other") + points(1.5, 1, a10, prefix="new", start=100)
    same_generation = ask(fit_fleet(pinned), "new0")
    pinned = points(1.0, 3, V100, prefix="other") + points(1.5, 1, V100, prefix="new", start=100)
    other_generation = ask(fit_fleet(pinned), "new0")
    alone = ask(fit_fleet(points(1.5, 1, V100, prefix="new")), "new0")
    assert alone.level == "job" and alone.sources == {"job": {"observations": 1, "jobs": 1}}
    assert 1 / 1.5 < same_generation.throughput_factor < others.throughput_factor - 0.02
    assert same_generation.throughput_factor < other_generation.throughput_factor < alone.throughput_factor < 0.95


def test_sibling_skus_of_a_chip_share_evidence_weaker_than_the_same_sku():
    same = ask(fit_fleet(points(1.5, 6)))
    sibling = ask(fit_fleet(points(1.5, 6, A100_PCIE)))
    assert sibling.level == "chip" and same.level == "accelerator"
    assert same.throughput_factor < sibling.throughput_factor < 1


def test_intervals_narrow_with_evidence_and_widen_when_jobs_disagree():
    agree = ask(fit_fleet(points(1.3, 3, prefix="new") + points(1.3, 6, start=100)), "new0")
    disagree = ask(fit_fleet(points(1.3, 3, prefix="new") + points(2.5, 3, start=100)
                             + points(0.6, 3, start=200, prefix="other")), "new0")
    assert agree.interval_scale < 1
    assert disagree.interval_scale > agree.interval_scale


@pytest.mark.parametrize("where", [A100, A100_PCIE], ids=["same SKU", "sibling SKU"])
def test_other_jobs_evidence_alone_moves_the_answer_but_never_narrows_it(where):
    """A job never observed, on an accelerator (or a sibling SKU) where others agree or disagree: corrected, and
    its interval at least as wide as uncalibrated."""
    for jobs in (1, 4, 16):
        applied = ask(fit_fleet(points(1.3, jobs, where)))
        assert applied.level in ("accelerator", "chip") and applied.throughput_factor < 1
        assert applied.interval_scale >= 1.0
    disagree = ask(fit_fleet(points(2.5, 3, where) + points(0.6, 3, where, start=100, prefix="other")))
    assert disagree.level in ("accelerator", "chip") and disagree.interval_scale >= 1.0


def test_a_new_jobs_interval_widens_when_the_jobs_observed_there_disagree_and_not_when_they_agree():
    """Jobs on an accelerator far apart from each other (one 10x slower than the model, three on it): a job never
    observed there is answered with a wider interval, on that SKU and its sibling; jobs that agree leave it as
    served."""
    agree = ask(fit_fleet(points(1.0, 4)))
    odd = fit_fleet(points(1.0, 3) + points(10.0, 1, start=100, prefix="odd"))
    assert agree.interval_scale == pytest.approx(1.0)
    assert ask(odd).interval_scale > 1.1 and ask(odd, where=A100_PCIE).interval_scale > 1.1
    assert ask(odd, where=V100) == NONE


def test_one_outlier_job_moves_other_jobs_by_a_bounded_share():
    honest = points(1.0, 5)
    assert ask(fit_fleet(honest)).throughput_factor == pytest.approx(1.0)
    for direction in (1, -1):
        shifts = []
        for ratio in (3.0, 50.0):
            for per_job in (1, 40):  # however often it reports
                odd = points(ratio ** direction, 1, per_job=per_job, start=1000, prefix="odd")
                shifts.append(abs(math.log(ask(fit_fleet(honest + odd)).throughput_factor)))
        assert max(shifts) < 0.125  # with five other jobs observed there
        assert max(shifts) == pytest.approx(min(shifts), rel=0.03)  # saturated: 50x off pulls hardly more than 3x


def test_a_job_counts_once_per_accelerator_however_often_it_reports():
    chatty = points(2.0, 1, per_job=50, prefix="chatty")
    quiet = points(0.5, 1, start=1000, prefix="quiet")
    assert ask(fit_fleet(chatty + quiet)).throughput_factor == pytest.approx(1.0, abs=1e-6)


def test_multi_device_runs_inform_single_device_answers_through_their_compute_only():
    # six jobs as predicted on one GPU, and on 8 GPUs where communication is half the predicted step and runs 3x
    # slower than predicted: a new job's one-device answer stays put, its 8-device answer slows down
    single = points(1.0, 6)
    slow_links = points(0.5 + 0.5 * 3.0, 6, start=100, communication_share=0.5)
    fleet = fit_fleet(single + slow_links)
    assert ask(fleet).throughput_factor == pytest.approx(1.0, abs=0.03)
    assert ask(fleet, communication_share=0.5).throughput_factor < 0.75
    # and the reverse: compute 1.5x slow on one device carries to the compute part of multi-device answers
    fleet = fit_fleet(points(1.5, 8))
    assert ask(fleet).throughput_factor < ask(fleet, communication_share=0.5).throughput_factor < 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["a", "b", "c"]), st.floats(0.02, 50.0),
                          st.floats(0.0, 0.9), st.booleans(), st.floats(0.0, 1.0)), min_size=1, max_size=30),
       st.sampled_from(["a", "b", "c", "d"]), st.floats(0.0, 0.9), st.floats(0.0, 1.0))
def test_factors_are_finite_bounded_and_intervals_positive(observed, accelerator, share, conv_share):
    chip = {"a": "X", "b": "X", "c": "Y", "d": "Y"}
    fleet = fit_fleet([FleetPoint(i, f"job{j}", acc, chip[acc], "arch", "tf32", math.log(ratio), s,
                                  reference=reference, conv_share=conv)
                       for i, (j, acc, ratio, s, reference, conv) in enumerate(observed)])
    for job in ("job0", "unseen"):
        applied = fleet.apply(FleetQuery(job, accelerator, chip[accelerator], "arch", "tf32", share, conv_share))
        assert 0.01 - 1e-9 <= applied.throughput_factor <= 100 + 1e-9
        assert applied.interval_scale > 0 and math.isfinite(applied.interval_scale)
        assert (applied.level == "none") == (applied.observations == 0)


def test_reference_steps_of_a_device_correct_it_nearly_fully_when_they_agree():
    steps = [FleetPoint(i, f"bench{i}", **A100, log_ratio=math.log(1.4 * (1 + 0.03 * (-1) ** i)), reference=True)
             for i in range(8)]
    applied = ask(fit_fleet(steps))
    assert applied.level == "accelerator" and applied.jobs == 8
    assert applied.throughput_factor == pytest.approx(1 / 1.4, rel=0.06)
    # the same ratios from ordinary jobs say less: each may be the job's own error
    ordinary = [FleetPoint(p.id, p.job, **A100, log_ratio=p.log_ratio) for p in steps]
    assert ask(fit_fleet(ordinary)).throughput_factor > applied.throughput_factor + 0.01


def test_reference_steps_that_split_by_convolution_share_correct_each_mix_by_its_own():
    """A device whose convolutions run 1.5x slower than the model says and the rest as it says (what a 2-core Xeon's
    reference steps show for the shipped CPU model): a convolutional job is slowed, a transformer is not, a job
    between them halfway (in log); a query without a share, or on another device, gets none of it."""
    steps = [FleetPoint(i, f"bench{i}", **A100, log_ratio=math.log(1.5 if conv else 1.0) + 0.02 * (-1) ** i,
                        reference=True, conv_share=1.0 if conv else 0.0)
             for i, conv in enumerate([True, False] * 4)]
    fleet = fit_fleet(steps)

    def slowdown(conv_share: float, where: dict[str, str] = A100) -> float:
        return 1 / fleet.apply(FleetQuery("new", **where, conv_share=conv_share)).throughput_factor

    assert 1.35 < slowdown(1.0) < 1.55 and 0.93 < slowdown(0.0) < 1.07
    assert slowdown(0.5) == pytest.approx(math.sqrt(slowdown(0.0) * slowdown(1.0)), rel=1e-9)
    assert slowdown(1.0, A100_PCIE) < 1.2  # a sibling SKU: its chip's evidence only, no op-mix term
    # one factor for the device when the steps carry no share: the conv and the rest averaged
    flat = fit_fleet([FleetPoint(p.id, p.job, **A100, log_ratio=p.log_ratio, reference=True) for p in steps])
    assert 1.1 < 1 / flat.apply(FleetQuery("new", **A100, conv_share=1.0)).throughput_factor < 1.3


def test_a_half_model_with_master_weights_shares_the_device_evidence_of_autocast_jobs():
    """apex O2 (`fp16-master`) and autocast (`amp`) run the same half kernels on the device: jobs observed under one
    correct the other's answers there, and neither those of another math."""
    amp, master = {**A100, "precision": "amp"}, {**A100, "precision": "fp16-master"}
    fleet = fit_fleet(points(1.5, 4, amp))
    assert ask(fleet, where=master).level == "accelerator" and ask(fleet, where=master) == ask(fleet, where=amp)
    assert ask(fit_fleet(points(1.5, 4, master)), where=amp).throughput_factor == pytest.approx(
        ask(fleet, where=amp).throughput_factor)
    assert ask(fleet, where={**A100, "precision": "fp16"}) == NONE  # a pure half model: another math

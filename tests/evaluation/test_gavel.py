"""Gavel's measured file read as Gavel reads it, every job type mapped to a zoo job, and the co-location fit
recovering constants it generated pairs with."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfmodel.evaluation.gavel import (
    GAVEL_FILE,
    Pair,
    error_band,
    fit_params,
    in_band,
    log_residuals,
    observed_on_the_gpu,
    pair_isolated,
    pair_mape,
    partner_ranking,
    predict_pairs,
    read_gavel,
    served_coverage,
    spec_of,
)
from perfmodel.jobs.zoo import ZOO
from perfmodel.placement.colocation import ColocationParams
from perfmodel.settings import get_settings


@pytest.fixture(scope="module")
def measured():
    path = Path(get_settings().datasets_dir) / "gavel" / GAVEL_FILE
    if not path.is_file():
        pytest.skip(f"Gavel's measured file is not at {path} (PERFMODEL_DATASETS_DIR)")
    return read_gavel(path)


def test_every_measured_job_type_is_a_zoo_job_at_its_batch(measured):
    job_types = {job for table in measured.values() for job, _ in table}
    assert len(job_types) == 26
    for job_type in job_types:
        spec = spec_of(job_type)
        assert spec.source.name in ZOO and spec.source.name.startswith("gavel-")
        if "batch size" in job_type:
            assert job_type.endswith(f"(batch size {spec.batch_size})")


def test_the_fit_recovers_the_constants_pairs_were_made_with():
    truth = ColocationParams(switch_overhead=0.25, host_share_of_gap=0.6, sync_wait_ms=20.0)
    jobs = [(10.0, 60.0), (20.0, 30.0), (5.0, 200.0), (40.0, 45.0)]  # (isolated steps/s, predicted device ms)
    pairs = []
    for i, (iso_a, dev_a) in enumerate(jobs):
        for iso_b, dev_b in jobs[i:]:
            pair = Pair("k80", f"a{i}", "b", (1.0, 1.0), (iso_a, iso_b), (dev_a, dev_b))
            shared = predict_pairs([pair], truth)[0]
            pairs.append(Pair("k80", pair.a, "b", (float(shared[0]), float(shared[1])), pair.isolated,
                              pair.device_ms))
    fitted = fit_params(pairs, "test")
    assert pair_mape(pairs, fitted) < 1e-6
    assert (fitted.switch_overhead, fitted.host_share_of_gap, fitted.sync_wait_ms) == pytest.approx((0.25, 0.6, 20))
    assert partner_ranking(pairs, fitted) > 0.9  # each job's partners in the order they were made
    assert abs(log_residuals(pairs, fitted)).max() < 1e-6


def test_the_error_band_holds_eight_in_ten_and_an_exact_answer_sits_inside_its_interval():
    import numpy as np

    residuals = np.random.default_rng(3).normal(0.1, 0.3, 20_000)
    band = error_band(residuals)
    assert band == pytest.approx((0.1 - 1.2816 * 0.3, 0.1 + 1.2816 * 0.3), abs=0.02)
    assert in_band(residuals, band) == pytest.approx(0.8, abs=0.01)
    # pairs made by the model from the predicted steps themselves: as served, exact, and inside the interval
    params = ColocationParams(sync_wait_ms=20.0, kept_band_log=band)
    pairs = []
    for steps_a, steps_b in ((10.0, 5.0), (2.0, 40.0)):
        made = Pair("p100", "a", "b", (1.0, 1.0), (steps_a, steps_b), (1e3 / steps_a, 1e3 / steps_b),
                    predicted=(steps_a, steps_b), predicted_interval=((steps_a / 2, steps_a * 2),
                                                                      (steps_b / 2, steps_b * 2)))
        shared = predict_pairs([made], params)[0]
        pairs.append(Pair(**{**made.__dict__, "measured": (float(shared[0]), float(shared[1]))}))
    mape, covered = served_coverage(pairs, params)
    assert mape < 1e-6 and covered == 1.0


def test_observations_of_other_families_calibrate_a_job_never_its_own():
    import pandas as pd

    from perfmodel.hardware.catalog import load_catalog

    rows = [{"worker": "k80", "job_type": f"{f} (batch size 8)", "family": f, "scale_factor": 1, "measured": 10.0,
             "predicted": 20.0} for f in ("ResNet-18", "LM", "Transformer")]  # every job 2x too fast on the K80
    rows.append({"worker": "p100", "job_type": "LM (batch size 8)", "family": "LM", "scale_factor": 1,
                 "measured": 10.0, "predicted": 20.0})  # alone on its GPU: nothing else observed there
    out = observed_on_the_gpu(pd.DataFrame(rows), load_catalog()).set_index(["worker", "family"])
    for family_ in ("ResNet-18", "LM", "Transformer"):
        assert out.loc[("k80", family_), "level"] != "none"
        assert 10.0 <= out.loc[("k80", family_), "calibrated"] < 20.0  # pulled toward the others' factor
    assert out.loc[("p100", "LM"), "level"] == "none" and out.loc[("p100", "LM"), "calibrated"] == 20.0
    # with each step's share of convolution FLOPs (as the service attaches it): when the convolutional jobs are
    # further off than the others, a convolutional job is pulled further than a job without convolutions
    shares = {"ResNet-18": 0.9, "ResNet-50": 0.9, "CycleGAN": 0.9, "LM": 0.0, "Transformer": 0.0}
    measured = {"ResNet-18": 5.0, "ResNet-50": 5.0, "CycleGAN": 5.0, "LM": 10.0, "Transformer": 10.0}
    mixed = pd.DataFrame([{"worker": "k80", "job_type": f"{f} (batch size 8)", "family": f, "scale_factor": 1,
                           "measured": measured[f], "predicted": 20.0, "conv_share": shares[f]} for f in shares])
    out = observed_on_the_gpu(mixed, load_catalog()).set_index("family")
    assert out.loc["CycleGAN", "calibrated"] < out.loc["LM", "calibrated"] < 20.0
    flat = observed_on_the_gpu(mixed.drop(columns="conv_share"), load_catalog()).set_index("family")
    assert out.loc["CycleGAN", "calibrated"] < flat.loc["CycleGAN", "calibrated"]


def test_pairs_are_scored_against_the_isolated_figure_the_jobs_same_job_pair_agrees_with():
    """A job whose two copies sharing a GPU keep a combined 0.4 of its own table's isolated figure, but 1.1 of the
    one-per-server table's, is scored against the latter; a job consistent with its own keeps it."""
    measured = {
        "p100": {("A", 1): {"null": 10.0, ("A", 1): [2.0, 2.0], ("B", 1): [1.5, 3.0]},
                 ("B", 1): {"null": 6.0, ("B", 1): [3.0, 3.0], ("A", 1): [3.0, 1.5]}},
        "p100_unconsolidated": {("A", 1): {"null": 3.6}, ("B", 1): {"null": 5.5}},
    }
    isolated = pair_isolated(measured, "p100")
    assert isolated == {"A": (3.6, "p100_unconsolidated"), "B": (6.0, "p100")}
    assert sum(measured["p100"][("A", 1)][("A", 1)]) / isolated["A"][0] == pytest.approx(4.0 / 3.6)
    # the shipped file: Recommendation only, at every batch, on both GPUs
    path = get_settings().datasets_dir / "gavel" / GAVEL_FILE
    if not path.is_file():
        pytest.skip(f"no Gavel file at {path} (../shared/datasets/gavel/)")
    real = read_gavel(path)
    for worker in ("k80", "p100"):
        swapped = {job for job, (_, table) in pair_isolated(real, worker).items() if table != worker}
        assert swapped and all(job.startswith("Recommendation") for job in swapped)


def test_a_worker_type_without_runs_is_answered_beside_the_measured_ones():
    """Gavel's third worker type (no run of it here): each job type's one-GPU steps/s on it, and its speed-up over
    each measured worker type's answer, as the table a scheduler reads holds them."""
    from perfmodel.engine import EngineConfig, PredictionEngine
    from perfmodel.evaluation.gavel import UNMEASURED_WORKER, Predicted, answered_speedups

    engine = PredictionEngine.open(EngineConfig(isolate_captures=False))
    jobs = ("LM (batch size 5)", "Recommendation (batch size 512)")
    measured = {"p100": {(job, 1): 1.0 for job in jobs}, "k80": {(jobs[0], 1): 1.0}}
    predicted = {("p100", jobs[0], 1): Predicted(10.0, 100.0, 0.0), ("p100", jobs[1], 1): Predicted(20.0, 50.0, 0.0),
                 ("k80", jobs[0], 1): Predicted(5.0, 200.0, 0.0)}
    out = answered_speedups(engine, measured, predicted, *UNMEASURED_WORKER)
    worker = UNMEASURED_WORKER[0]
    assert list(out.index) == sorted(jobs) and (out[worker] > 0).all()
    assert out.loc[jobs[0], "over_p100"] == pytest.approx(out.loc[jobs[0], worker] / 10.0)
    assert out.loc[jobs[1], "over_p100"] == pytest.approx(out.loc[jobs[1], worker] / 20.0)
    assert out.loc[jobs[0], "over_k80"] == pytest.approx(out.loc[jobs[0], worker] / 5.0)
    assert out.loc[jobs[1], "over_k80"] != out.loc[jobs[1], "over_k80"]  # no K80 answer: no speed-up (NaN)

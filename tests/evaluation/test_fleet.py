"""The fleet bench's protocols on a synthetic fleet whose errors are a model part and a GPU part: every predicted
run's own measurement unused, and observing the model elsewhere helps where model errors dominate."""

from __future__ import annotations

import math

import pandas as pd

from perfmodel.evaluation.fleet import (
    OP_GROUP_SHARES,
    error_floors,
    fleet_frame,
    job_elsewhere,
    same_gpu,
    shrunk_other_models,
    summary,
)
from perfmodel.hardware.catalog import load_catalog

GPUS = ("a100-sxm4-80gb", "a100-pcie-40gb", "v100-sxm2-32gb", "rtx-3090", "t4")
MODELS = {"m1": 0.6, "m2": -0.3, "m3": 0.1, "m4": 0.9}  # each model's own log error
GPU_ERROR = {"a100-sxm4-80gb": 0.1, "a100-pcie-40gb": 0.12, "v100-sxm2-32gb": -0.1, "rtx-3090": 0.0, "t4": 0.05}


def _composed() -> pd.DataFrame:
    rows = []
    for model, error in MODELS.items():
        for gpu in GPUS:
            for devices in (1, 4):
                predicted = 100.0 * devices ** 0.1
                rows.append({"model": model, "precision": "tf32", "accelerator": gpu, "devices": devices,
                             "placement_ms": predicted, "communication_ms": 0.0 if devices == 1 else 10.0,
                             "measured_ms": predicted * math.exp(error + GPU_ERROR[gpu])})
    return pd.DataFrame(rows)


def test_protocols_predict_only_unobserved_runs_and_the_model_elsewhere_helps():
    frame = fleet_frame(_composed(), load_catalog())
    same = same_gpu(frame, ks=(0, 1, 2), draws=5)
    assert set(same.k) == {0, 1, 2} and (same.predicted_ms > 0).all()
    elsewhere = job_elsewhere(frame, ks=(0, 1, 2))
    assert len(elsewhere[elsewhere.k == 1]) == len(frame)  # every run predicted once per k
    table = summary(elsewhere)
    assert table.loc[1, "mape_1gpu_pct"] < table.loc[0, "mape_1gpu_pct"] / 2
    assert table.loc[2, "mape_ngpu_pct"] < table.loc[0, "mape_ngpu_pct"] / 2
    assert ((table.coverage_80_pct >= 0) & (table.coverage_80_pct <= 100)).all()


def test_error_floors_are_zero_where_the_factors_explain_the_errors_and_other_models_say_what_they_say():
    """Errors that are a model part plus a GPU part: the two-way fit explains them all; each model's time all in one
    op group of its own: per-GPU op-group factors explain them all; the other models' mean misses by the model's
    difference from them."""
    composed = _composed()
    for share in OP_GROUP_SHARES:
        composed[share] = 0.0
    for model, share in zip(MODELS, OP_GROUP_SHARES):
        composed.loc[composed.model == model, share] = 1.0
    floors = error_floors(fleet_frame(composed, load_catalog()))
    assert floors["gpu_and_model"] < 1e-6 and floors["op_groups_per_gpu"] < 1e-6
    errors = list(MODELS.values())
    # each run's log error less the others' mean, as the throughput's APE: |measured / corrected - 1|
    want = sum(abs(math.exp(e - (sum(errors) - e) / (len(errors) - 1)) - 1) for e in errors) / len(errors) * 100
    assert math.isclose(floors["other_models_mean"], want, rel_tol=1e-9)


def test_on_served_answers_the_interval_is_the_served_band_scaled_as_the_service_scales_it():
    """With the served band in the targets, nothing observed gives that band unchanged; with observations, the
    band's log width times the calibration's `interval_scale` about the calibrated step (what the engine answers)."""
    from perfmodel.evaluation.fleet import points_of, predict_rows

    frame = fleet_frame(_composed(), load_catalog())
    frame = frame.assign(served_low_ms=frame.placement_ms * 0.8, served_high_ms=frame.placement_ms * 1.5)
    gpu = frame[frame.accelerator == "rtx-3090"]
    alone = predict_rows([], gpu)
    assert (alone.low_ms == gpu.served_low_ms).all() and (alone.high_ms == gpu.served_high_ms).all()
    seen = gpu.model.isin(["m1", "m2"])
    rows = predict_rows(points_of(gpu[seen]), gpu[~seen])
    low, high = rows.low_ms / rows.predicted_ms, rows.high_ms / rows.predicted_ms
    scale = pd.Series(low.map(math.log) / math.log(0.8))
    assert (rows.level != "none").all() and (scale > 0).all()
    assert (high.map(math.log) / math.log(1.5) - scale).abs().max() < 1e-9  # one scale for both ends


def test_the_best_share_of_other_models_errors_takes_a_shared_gpu_error_whole_and_leaves_model_errors_alone():
    """Errors that are the GPU's alone: the best share is 1 and it leaves nothing; errors that are the models' own,
    around no common offset (the GPU part zero): any share of the others' mean only adds theirs, so the best is 0."""
    composed = _composed()
    gpu_only = composed.assign(measured_ms=composed.placement_ms * composed.accelerator.map(GPU_ERROR).map(math.exp))
    table = shrunk_other_models(fleet_frame(gpu_only, load_catalog()), ks=(1, 2), draws=5)
    assert list(table.index) == [1, 2]
    assert (table.best_shrink == 1.0).all() and (table.best_mape_1gpu_pct < 1e-9).all()
    assert (table.mape_at_0_pct > 1.0).all()
    centred = {model: error - sum(MODELS.values()) / len(MODELS) for model, error in MODELS.items()}
    model_only = composed.assign(measured_ms=composed.placement_ms * composed.model.map(centred).map(math.exp))
    table = shrunk_other_models(fleet_frame(model_only, load_catalog()), ks=(1, 2), draws=5)
    assert (table.best_shrink == 0.0).all()
    assert (table.best_mape_1gpu_pct == table.mape_at_0_pct).all() and (table.mape_at_1_pct > table.mape_at_0_pct).all()

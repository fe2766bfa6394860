"""device-whole-step: a spec-sheet device effect plus a level per measured model, learned from real runs."""

import numpy as np
import pandas as pd
import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.regressors import load_regressor
from perfmodel.regressors.whole_step import TARGET
from perfmodel.regressors.whole_step_device import JOB, DeviceStepRegressor, job_level_key

FEATURES = ("log_ridge", "log_bandwidth_gb_s")
LEVELS = {"m0:amp": 0.5, "m1:amp": 0.0, "m2:tf32": -0.2, "m3:tf32": 0.3}
RIDGE_WEIGHT = 0.15  # log factor per doubling of the ridge point


def runs(seed: int = 0) -> pd.DataFrame:
    """Each model on twelve GPUs: log(measured / composed) = its level + 0.15 x log2 ridge (centred) + noise."""
    rng = np.random.default_rng(seed)
    gpus = pd.DataFrame({"log_ridge": rng.uniform(5, 9, 12), "log_bandwidth_gb_s": rng.uniform(8, 11, 12),
                         "chip": [f"chip{i // 2}" for i in range(12)]})
    rows = []
    for job, level in LEVELS.items():
        for gpu in gpus.itertuples(index=False):
            rows.append({"log_ridge": gpu.log_ridge, "log_bandwidth_gb_s": gpu.log_bandwidth_gb_s, "chip": gpu.chip,
                         JOB: job, "family": job.split(":")[0],
                         TARGET: level + RIDGE_WEIGHT * (gpu.log_ridge - 7.0) + rng.normal(0, 0.01)})
    return pd.DataFrame(rows)


def fitted(frame: pd.DataFrame) -> DeviceStepRegressor:
    return DeviceStepRegressor(feature_names=FEATURES, ridge=0.01, unseen_features=None).fit(
        frame, groups=list(frame.family), jobs=list(frame[JOB]), chips=list(frame.chip))


def test_it_learns_each_models_level_and_the_device_effect_apart():
    frame = runs()
    model = fitted(frame)
    centre = frame.log_ridge.mean()
    for job, level in LEVELS.items():  # each measured model's level, at the data's average GPU
        assert np.log(model.levels()[job]) == pytest.approx(level + RIDGE_WEIGHT * (centre - 7.0), abs=0.03)
    # one more doubling of the ridge point moves every job's factor by the learned weight, seen or not
    probe = pd.DataFrame({"log_ridge": [6.0, 7.0], "log_bandwidth_gb_s": [9.5, 9.5], JOB: ["m0:amp", None]})
    for job in ("m0:amp", None):
        two = model.predict(probe.assign(**{JOB: job})).log_factor
        assert two[1] - two[0] == pytest.approx(RIDGE_WEIGHT, abs=0.02)


def test_a_model_never_measured_gets_the_device_effect_alone_and_the_wider_band():
    model = fitted(runs())
    probe = pd.DataFrame({"log_ridge": [7.0] * 3, "log_bandwidth_gb_s": [9.5] * 3, JOB: ["m0:amp", "new:amp", None]})
    out = model.predict(probe)
    assert out.log_factor[1] == out.log_factor[2]  # an unknown key is no key
    assert out.log_factor[0] - out.log_factor[1] == pytest.approx(np.log(model.levels()["m0:amp"]))
    assert np.all(out.log_low <= out.log_factor) and np.all(out.log_factor <= out.log_high)
    seen_band, unseen_band = (out.log_high - out.log_low)[[0, 1]]
    assert unseen_band > seen_band  # the levels of unseen models spread far more than one model across GPUs


def test_a_gpu_outside_the_measured_ones_adds_an_unseen_gpus_error_to_the_band():
    """An answer on a newer (or older) generation than every measured GPU is two extrapolations: its band is the
    job's and the GPU folds' in quadrature, wider than on a measured GPU (at most by the GPU folds' band)."""
    model = fitted(runs())
    probe = pd.DataFrame({"log_ridge": [7.0, 12.0, 2.0], "log_bandwidth_gb_s": [9.5] * 3, JOB: [None] * 3})
    out = model.predict(probe)
    inside, above, below = (out.log_high - out.log_low)
    seen = model.bands_["seen"][1] - model.bands_["seen"][0]
    assert above > inside and below > inside and above <= inside + seen + 1e-9
    assert np.all(out.log_low <= out.log_factor) and np.all(out.log_factor <= out.log_high)


def test_the_convolution_math_moves_the_factor_within_one_level_and_is_no_gpu_outside_the_measured_ones():
    """One model's TF32 level holds steps whose convolutions run in TF32 (slower than composed) and steps whose
    convolutions run as fp32 Winograd (faster): the stage tells them apart by the step's shares of each. A model never
    measured pays for its TF32 share, and counts its fp32 3 x 3 share as none (`SEEN_ONLY_FEATURES`)."""
    from perfmodel.regressors.whole_step_device import CONV_MATH_FEATURES, STAGE_FEATURES

    rng = np.random.default_rng(3)
    rows = []
    for job in ("m0:tf32", "m1:tf32", "m2:amp"):
        for i in range(24):
            tf32 = rng.uniform(0.2, 0.6) if i % 2 and job != "m2:amp" else 0.0
            winograd = rng.uniform(0.2, 0.6) if not i % 2 and job != "m2:amp" else 0.0
            rows.append({"log_peak_tensor_tflops": rng.uniform(3, 8), "log_peak_per_watt": rng.uniform(4, 10),
                         "amp": float(job.endswith("amp")), "share_conv_tf32": tf32, "share_conv_winograd": winograd,
                         "share_conv_amp": 0.0, JOB: job, "family": job[:2], "chip": f"chip{i % 6}",
                         TARGET: 0.8 * tf32 - 0.6 * winograd + rng.normal(0, 0.01)})
    frame = pd.DataFrame(rows)
    model = DeviceStepRegressor(ridge=0.01).fit(frame, groups=list(frame.family), jobs=list(frame[JOB]),
                                               chips=list(frame.chip))
    assert set(CONV_MATH_FEATURES) <= set(model.feature_names) == set(STAGE_FEATURES)
    probe = pd.DataFrame([{**frame.iloc[0].to_dict(), "share_conv_tf32": t, "share_conv_winograd": w, JOB: job}
                          for job in ("m0:tf32", None) for t, w in ((0.0, 0.0), (0.5, 0.0), (0.0, 0.5))])
    out = model.predict(probe)
    for seen in (0, 3):  # a measured model and one never measured
        base, tf32, winograd = out.log_factor[seen:seen + 3]
        assert tf32 - base == pytest.approx(0.4, abs=0.08)
        assert winograd - base == (pytest.approx(-0.3, abs=0.08) if seen == 0 else 0.0)
    # with no seen-only feature, a model never measured takes the fp32 share's credit too
    kept = DeviceStepRegressor(ridge=0.01, seen_only=()).fit(frame, groups=list(frame.family), jobs=list(frame[JOB]),
                                                             chips=list(frame.chip))
    base, _, winograd = kept.predict(probe).log_factor[3:]
    assert winograd - base == pytest.approx(-0.3, abs=0.08)
    # more TF32 convolution than any run had: the share is clipped to the measured range, and the band is no wider
    # (a step's mix is no GPU outside the measured ones)
    wide = model.predict(probe.assign(share_conv_tf32=0.99))
    top = model.predict(probe.assign(share_conv_tf32=frame.share_conv_tf32.max()))
    np.testing.assert_allclose(wide.log_factor, top.log_factor)
    np.testing.assert_allclose(wide.log_high - wide.log_low, out.log_high - out.log_low)


def test_a_gpu_beyond_the_data_gets_the_nearest_measured_effect_and_one_below_it_none():
    frame = runs()
    model = fitted(frame)
    top, bottom = frame.log_ridge.max(), frame.log_ridge.min()
    far = pd.DataFrame({"log_ridge": [top, top + 3.0, bottom - 3.0], "log_bandwidth_gb_s": [9.5] * 3,
                        JOB: [None, "m0:amp", "m0:amp"]})
    factor = model.predict(far).log_factor
    level = np.log(model.levels()["m0:amp"])
    # a newer GPU: the newest measured one's effect, not an extrapolated line
    assert factor[1] - level == pytest.approx(factor[0])
    # an older or smaller GPU than any measured: the runs say nothing of it, so no device effect (its level stays)
    assert factor[2] == pytest.approx(level)


def test_save_load_predicts_the_same_and_the_manifest_says_what_it_is(tmp_path):
    frame = runs()
    model = fitted(frame)
    model.save(tmp_path / "stage")
    again = load_regressor(tmp_path / "stage")
    assert isinstance(again, DeviceStepRegressor) and again.feature_names == FEATURES
    np.testing.assert_array_equal(again.predict(frame).log_factor, model.predict(frame).log_factor)
    np.testing.assert_array_equal(again.predict(frame).log_high, model.predict(frame).log_high)
    assert again.metrics_["oof_mape_unseen"] > again.metrics_["oof_mape_seen"]


def test_a_stage_saved_before_seen_only_features_answers_as_it_did(tmp_path):
    """The settings round-trip; a manifest without `seen_only` (a stage saved before it was kept) loads with none, so
    a shipped older version answers a model never measured as it always did."""
    import json

    model = DeviceStepRegressor(feature_names=FEATURES, ridge=0.01, unseen_features=None,
                                seen_only=("log_ridge",)).fit(runs(), groups=list(runs().family))
    model.save(tmp_path / "stage")
    assert load_regressor(tmp_path / "stage").seen_only == ("log_ridge",)
    manifest = json.loads((tmp_path / "stage" / "manifest.json").read_text())
    del manifest["settings"]["seen_only"]
    (tmp_path / "stage" / "manifest.json").write_text(json.dumps(manifest))
    older = load_regressor(tmp_path / "stage")
    assert older.seen_only == ()
    probe = runs()[list(FEATURES)].head(3)  # no job: models never measured
    assert not np.allclose(older.predict(probe).log_factor, model.predict(probe).log_factor)


def test_bad_input_is_a_clear_error():
    frame = runs()
    with pytest.raises(PerfmodelError, match="not fitted"):
        DeviceStepRegressor(feature_names=FEATURES, unseen_features=None).predict(frame)
    with pytest.raises(PerfmodelError, match="missing"):
        fitted(frame).predict(frame.drop(columns=["log_ridge"]))
    with pytest.raises(PerfmodelError, match="one value per row"):
        DeviceStepRegressor(feature_names=FEATURES, unseen_features=None).fit(frame, groups=list(frame.family),
                                                                               jobs=["x"])
    with pytest.raises(PerfmodelError, match="finite"):
        DeviceStepRegressor(feature_names=FEATURES, unseen_features=None).fit(
            frame.assign(**{TARGET: np.inf}), groups=list(frame.family))


def test_older_software_is_learned_from_the_same_gpus_on_both_and_taken_off_what_is_answered(tmp_path):
    """The same GPUs ran each model on an old and the newest software: the old one 25 % slower. The stage learns
    that offset from the pairs, answers for the newest, and keeps the offset through save/load."""
    from perfmodel.regressors.whole_step_device import software_offsets

    frame = runs()
    old = np.arange(len(frame)) % 2 == 0  # half of each model's GPUs on both versions: every other row doubled
    both = pd.concat([frame.assign(version="1.13"), frame[old].assign(version="1.4")], ignore_index=True)
    both[TARGET] = both[TARGET] + np.where(both.version == "1.4", np.log(1.25), 0.0)
    devices = list(both.chip + "/" + both.log_ridge.round(6).astype(str))
    reference, offsets = software_offsets(both[TARGET].to_numpy(), list(both.version), devices, list(both[JOB]))
    assert reference == "1.13" and offsets["1.4"] == pytest.approx(np.log(1.25), abs=0.01)
    model = DeviceStepRegressor(feature_names=FEATURES, ridge=0.01, unseen_features=None).fit(
        both, groups=list(both.family), jobs=list(both[JOB]), chips=list(both.chip), software=list(both.version),
        devices=devices)
    plain = fitted(frame)  # the newest software's runs alone
    np.testing.assert_allclose(model.predict(frame).log_factor, plain.predict(frame).log_factor, atol=0.02)
    # the newest, a newer one and an unknown one are answered as the newest; one older than every learned version
    # as the oldest
    np.testing.assert_allclose(model.software_offset(["1.4", "1.13", "2.5", "", None, "0.4"]),
                               [offsets["1.4"], 0, 0, 0, 0, offsets["1.4"]])
    model.save(tmp_path / "stage")
    again = load_regressor(tmp_path / "stage")
    np.testing.assert_array_equal(again.software_offset(["1.4"]), model.software_offset(["1.4"]))
    assert again.metrics_["software_reference"] == "1.13"
    # unknown versions are neither used nor corrected; too few pairs give no offset; one version gives none
    assert software_offsets(np.zeros(3), ["", "", ""], ["a", "b", "c"], ["j"] * 3) == ("", {})
    assert software_offsets(np.array([0.0, 1.0]), ["1.4", "1.13"], ["a", "a"], ["j", "j"]) == ("1.13", {"1.4": 0.0})
    with pytest.raises(PerfmodelError, match="software needs devices"):
        DeviceStepRegressor(feature_names=FEATURES, unseen_features=None).fit(
            both, groups=list(both.family), software=list(both.version))


def test_a_version_between_two_learned_ones_is_answered_as_the_newer_one():
    """Software offsets of 1.4, 1.7 and 1.10 against 1.13: 1.5 runs as 1.7 does (at least as well as 1.4), 1.11 as
    1.13; the offsets never grow with the version."""
    model = fitted(runs())
    model.software_ = {"reference": "1.13", "offsets": {"1.4": 0.15, "1.7": 0.08, "1.10": 0.01}}
    versions = ["0.4", "1.4", "1.5", "1.7", "1.8", "1.10", "1.11", "1.13", "2.0"]
    offsets = model.software_offset(versions)
    np.testing.assert_allclose(offsets, [0.15, 0.15, 0.08, 0.08, 0.01, 0.01, 0.0, 0.0, 0.0])
    assert np.all(np.diff(offsets) <= 0)


def test_level_keys_name_a_zoo_model_and_its_math():
    assert job_level_key("ssd300", "amp") == "ssd300:amp"
    assert job_level_key(None, "amp") is None and job_level_key("", "tf32") is None


# --- the stage in the serving path: the job's level reaches it, and the bounds hold --------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from perfmodel.hardware.catalog import get_accelerator, load_catalog  # noqa: E402
from perfmodel.jobs.spec import JobSpec  # noqa: E402
from perfmodel.placement.spec import Parallelism, PlacementSpec  # noqa: E402
from perfmodel.predictor.placed import PlacementPredictor  # noqa: E402
from perfmodel.predictor.whole_step import WholeStepStage, level_key  # noqa: E402
from perfmodel.regressors.whole_step_device import UNSEEN_FEATURES  # noqa: E402

SERVED_LEVELS = {"resnet18:amp": -4.0, "resnet18:tf32": 2.0, "bert-small:amp": 0.7}  # absurd on purpose
GPUS = sorted(name for name, spec in load_catalog().items() if spec.kind == "gpu")


@pytest.fixture(scope="module")
def served():
    """The shipped predictor with a device stage fitted on synthetic runs whose levels are far from 1."""
    rng = np.random.default_rng(1)
    rows = [{**{name: rng.uniform(0, 10) for name in UNSEEN_FEATURES}, JOB: job, "family": job.split(":")[0],
             TARGET: level + rng.normal(0, 0.05)} for job, level in SERVED_LEVELS.items() for _ in range(10)]
    frame = pd.DataFrame(rows)
    stage = DeviceStepRegressor().fit(frame, groups=list(frame.family), jobs=list(frame[JOB]))
    predictor = PlacementPredictor.load()
    predictor.set_whole_step(WholeStepStage(stage, "device-whole-step/test"))
    return predictor


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(job=st.sampled_from(["resnet18", "bert-small"]), gpu=st.sampled_from(GPUS),
       precision=st.sampled_from(["amp", "tf32", "fp32"]), devices=st.sampled_from([2, 4, 8]))
def test_served_answers_take_the_jobs_level_and_stay_physically_possible(served, job, gpu, precision, devices):
    spec = JobSpec.from_options(zoo=job, batch_size=8, seq_len=64, precision=precision)
    one = PlacementSpec(accelerator=gpu, devices_per_node=(1,), global_batch_size=spec.batch_size)
    many = PlacementSpec(accelerator=gpu, devices_per_node=(devices,), global_batch_size=spec.batch_size * devices,
                         parallelism=Parallelism(data=devices))
    single, placed = served.predict(spec, one), served.predict(spec, many)
    features = served.composition(spec, one)
    assert single.composed_iter_time_ms is not None and features is not None
    factor = single.iter_time_ms / single.composed_iter_time_ms
    floor = features["roofline_over_composed"]
    level = SERVED_LEVELS.get(str(level_key(spec, get_accelerator(gpu))))
    if level is not None and level > 0:  # the job's own (pessimistic) level reached the stage
        assert factor > 1.5
    assert factor >= floor * (1 - 1e-9)  # never faster than every kernel at its roofline
    assert single.interval_ms[0] <= single.iter_time_ms * (1 + 1e-9)
    assert single.iter_time_ms <= single.interval_ms[1] * (1 + 1e-9)
    assert placed.throughput_samples_per_s <= devices * single.throughput_samples_per_s * (1 + 1e-9)


def test_a_model_never_measured_pays_for_its_half_precision_convolutions():
    """Unseen models: what AMP convolutions cost is learned from the AMP and TF32 runs of each measured model."""
    rng = np.random.default_rng(2)
    rows = []
    for model, conv in (("convnet", 0.6), ("detector", 0.5), ("lm", 0.0), ("recsys", 0.05)):
        for amp in (0.0, 1.0):
            for _ in range(12):
                rows.append({"log_ridge": rng.uniform(5, 9), "amp": amp, "share_conv_amp": conv * amp,
                             JOB: f"{model}:{'amp' if amp else 'tf32'}", "family": model, "chip": f"c{len(rows) % 5}",
                             TARGET: 0.2 * (model == "detector") + 0.7 * conv * amp + rng.normal(0, 0.02)})
    frame = pd.DataFrame(rows)
    model = DeviceStepRegressor(feature_names=("log_ridge", "amp"), ridge=0.01,
                                unseen_features=("log_ridge", "amp", "share_conv_amp")).fit(
        frame, groups=list(frame.family), jobs=list(frame[JOB]), chips=list(frame.chip))
    probe = pd.DataFrame({"log_ridge": [7.0, 7.0], "amp": [1.0, 1.0], "share_conv_amp": [0.0, 0.6],
                          JOB: ["new:amp", "new:amp"]})
    factor = model.predict(probe).log_factor
    assert factor[1] - factor[0] == pytest.approx(0.7 * 0.6, abs=0.05)


def test_a_mix_of_features_no_measured_gpu_had_gets_no_more_effect_than_the_measured_gpus_got():
    """Each feature inside its measured range, but together beyond any measured GPU (a high ridge point on a GPU of
    low bandwidth): the effect stops where the measured GPUs' did."""
    frame = runs()
    model = DeviceStepRegressor(feature_names=FEATURES, ridge=0.01, unseen_features=None).fit(
        frame.assign(**{TARGET: frame[TARGET] - 0.1 * (frame.log_bandwidth_gb_s - 9.5)}),
        groups=list(frame.family), jobs=list(frame[JOB]), chips=list(frame.chip))
    measured = model.predict(frame[list(FEATURES)]).log_factor
    corners = pd.DataFrame([{"log_ridge": r, "log_bandwidth_gb_s": b}
                            for r in (frame.log_ridge.min(), frame.log_ridge.max())
                            for b in (frame.log_bandwidth_gb_s.min(), frame.log_bandwidth_gb_s.max())])
    at_corners = model.predict(corners).log_factor
    assert at_corners.max() <= measured.max() + 1e-12 and at_corners.min() >= measured.min() - 1e-12
    unclipped = np.nan_to_num(corners.to_numpy() - np.asarray(model.params_["mean"])) @ np.asarray(
        model.params_["weights"])
    assert unclipped.max() > measured.max() or unclipped.min() < measured.min()  # the corners did go beyond


def test_a_model_never_measured_takes_what_amp_costs_from_each_models_amp_and_tf32_runs():
    """AMP is the same on every run of a (model, math) level, so the fit with those levels gives it no weight (any
    weight there would be arbitrary); an unseen job's AMP term comes from the fit with one level per model, where
    each model's AMP runs against its TF32 runs tell it."""
    rng = np.random.default_rng(3)
    rows = []
    for model, level in (("a", 0.3), ("b", -0.2), ("c", 0.1), ("d", 0.0)):
        for amp in (0.0, 1.0):
            for _ in range(12):
                rows.append({"log_ridge": rng.uniform(5, 9), "amp": amp, JOB: f"{model}:{'amp' if amp else 'tf32'}",
                             "family": model, "chip": f"c{len(rows) % 5}",
                             TARGET: level - 0.25 * amp + rng.normal(0, 0.02)})
    frame = pd.DataFrame(rows)
    model = DeviceStepRegressor(feature_names=("log_ridge", "amp"), ridge=0.01,
                                unseen_features=("log_ridge", "amp")).fit(
        frame, groups=list(frame.family), jobs=list(frame[JOB]), chips=list(frame.chip))
    assert model.params_["weights"][1] == 0.0
    assert model.extra_weights_["amp"] == pytest.approx(-0.25, abs=0.03)
    probe = pd.DataFrame({"log_ridge": [7.0, 7.0], "amp": [0.0, 1.0], JOB: ["new:tf32", "new:amp"]})
    factor = model.predict(probe).log_factor
    assert factor[1] - factor[0] == pytest.approx(-0.25, abs=0.03)
    assert model.levels()["a:amp"] == pytest.approx(np.exp(0.05), abs=0.03)  # the level keeps its own AMP cost


def test_fp32_on_a_gpu_without_tf32_takes_the_measured_tf32_level():
    """On a V100 fp32, fp32-strict and tf32 are the same math: GNMT's answer is the same step whichever is asked (the
    measured level of the public runs' "FP32", TF32 where the GPU has it, applied to all three); on an A100 fp32
    (strict matmuls) is another step than tf32 and gets no level of its own."""
    v100, a100 = get_accelerator("v100-sxm2-16gb"), get_accelerator("a100-sxm4-80gb")
    specs = {p: JobSpec.from_options(zoo="gnmt", batch_size=8, precision=p) for p in ("fp32", "fp32-strict", "tf32")}
    assert {level_key(spec, v100) for spec in specs.values()} == {"gnmt:tf32"}
    assert level_key(specs["tf32"], a100) == "gnmt:tf32" and level_key(specs["fp32"], a100) == "gnmt:fp32"
    assert level_key(JobSpec.from_options(module="m.py:make", batch_size=8), v100) is None


def test_a_mixed_precision_recipe_never_measured_takes_its_twins_level():
    """A model measured under one mixed-precision recipe only (GNMT: apex O2, `fp16-master`; Mask R-CNN: per-op
    casts, `amp`) lends that level to the other recipe of the same half kernels, never over a level of its own and
    never to another math."""
    a100 = get_accelerator("a100-sxm4-80gb")
    spec = {p: JobSpec.from_options(zoo="gnmt", batch_size=8, precision=p)
            for p in ("amp", "fp16-master", "amp-bf16", "bf16-master", "fp16", "tf32")}
    master_only = frozenset({"gnmt:fp16-master", "gnmt:tf32"})
    assert level_key(spec["amp"], a100, master_only) == "gnmt:fp16-master"
    assert level_key(spec["fp16-master"], a100, master_only) == "gnmt:fp16-master"
    assert level_key(spec["fp16"], a100, master_only) == "gnmt:fp16"  # a pure half model: no twin
    assert level_key(spec["bf16-master"], a100, master_only) == "gnmt:bf16-master"  # another half type
    both = master_only | {"gnmt:amp", "gnmt:amp-bf16"}
    assert level_key(spec["amp"], a100, both) == "gnmt:amp"  # its own level first
    assert level_key(spec["bf16-master"], a100, both) == "gnmt:amp-bf16"
    assert level_key(spec["fp16-master"], a100) == "gnmt:fp16-master"  # a stage without levels: its own key

"""Few-shot adaptation of the shipped device-ops model: shrinkage, intervals, the roofline, artifacts, and the
predictor using a saved adaptation (also for the CPU)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from perfmodel.core.accuracy import mape_pct
from perfmodel.features.device_ops import device_op_features
from perfmodel.hardware.catalog import load_catalog
from perfmodel.jobs.spec import JobSpec
from perfmodel.registry.registry import ModelRegistry
from perfmodel.regressors import load_regressor
from perfmodel.regressors.adaptation import AdaptedRegressor, DeviceAdaptation, adaptations_dir, load_adaptations

TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 1000, "n_positions": 64}


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.fixture(scope="module")
def model():
    return load_regressor(ModelRegistry().get(None, role="device-ops").path)


def gemm_rows(n: int, device: str, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    size = 2 ** rng.uniform(4, 11, size=(n, 3))
    return pd.DataFrame({"op_class": "linear", "op_name": "linear", "dtype": "fp32", "device": device,
                         "batch": rng.integers(1, 16, n), "m": size[:, 0].astype(int), "n": size[:, 1].astype(int),
                         "k": size[:, 2].astype(int)})


def measured(rows: pd.DataFrame, model, catalog, seed: int) -> pd.DataFrame:
    """A device 1.8x slower than the model thinks on small ops, 1.3x on large ones, with 5 % noise."""
    base = model.predict(rows, catalog).latency_ms
    flops = device_op_features(rows, catalog)["log_flops"].to_numpy()
    factor = np.where(flops < 25, 1.8, 1.3) * np.exp(np.random.default_rng(seed).normal(0, 0.05, len(rows)))
    return rows.assign(latency_ms=base * factor)


def test_adaptation_learns_the_device_and_shrinks_with_few_rows(model, catalog):
    test = measured(gemm_rows(400, "t4", 99), model, catalog, 99)
    base = model.predict(test, catalog)
    errors, widths, shifts = [], [], []
    for n in (2, 10, 50, 200):
        rows = measured(gemm_rows(n, "t4", n), model, catalog, n)
        out = DeviceAdaptation.fit(model, rows, catalog).predict(model, test, catalog)
        errors.append(mape_pct(out.latency_ms, test["latency_ms"]))
        widths.append(float(np.mean(np.log(out.p90_ms / out.p10_ms))))
        shifts.append(float(np.mean(np.log(out.latency_ms / base.latency_ms))))
        # never wider than the base model's interval, and the median inside its own interval
        assert (np.log(out.p90_ms / out.p10_ms) <= np.log(base.p90_ms / base.p10_ms) + 1e-9).all()
        assert (out.p10_ms <= out.latency_ms).all() and (out.latency_ms <= out.p90_ms).all()
    base_error = mape_pct(base.latency_ms, test["latency_ms"])
    assert errors[-1] < 10 < base_error  # the device is 30-80 % slower than predicted: learned
    assert all(e <= base_error for e in errors)  # never worse than no rows
    assert errors[-1] <= errors[0] and widths[-1] < widths[0]  # more rows: better, surer
    assert 0 < shifts[0] < shifts[-1]  # 2 rows move the prediction less than 200 do (shrinkage toward the base)


def test_no_rows_no_change_and_other_devices_untouched(model, catalog):
    rows = measured(gemm_rows(30, "t4", 1), model, catalog, 1)
    wrapped = AdaptedRegressor(model, {"t4": DeviceAdaptation.fit(model, rows, catalog)}, catalog)
    other = gemm_rows(50, "v100-pcie-32gb", 2)
    np.testing.assert_array_equal(wrapped.predict(other, catalog).latency_ms, model.predict(other, catalog).latency_ms)
    mixed = pd.concat([other, gemm_rows(20, "t4", 3)], ignore_index=True)
    out, base = wrapped.predict(mixed, catalog), model.predict(mixed, catalog)
    t4 = (mixed["device"] == "t4").to_numpy()
    np.testing.assert_array_equal(out.latency_ms[~t4], base.latency_ms[~t4])
    assert (out.latency_ms[t4] > base.latency_ms[t4]).all()  # the t4 rows learned it is slower
    # classes without rows of the device keep the base prediction
    softmax = pd.DataFrame({"op_class": "softmax", "op_name": "softmax", "dtype": "fp32", "device": "t4",
                            "batch": [64, 512], "hidden": [1024, 4096]})
    np.testing.assert_array_equal(wrapped.predict(softmax, catalog).latency_ms,
                                  model.predict(softmax, catalog).latency_ms)


def test_never_below_the_roofline(model, catalog):
    rows = gemm_rows(40, "t4", 4)
    rows = rows.assign(latency_ms=model.predict(rows, catalog).latency_ms * 0.01)  # impossible: 100x the peak
    out = DeviceAdaptation.fit(model, rows, catalog).predict(model, rows, catalog)
    roofline = np.exp2(device_op_features(rows, catalog)["log_roofline_ms"].to_numpy())
    assert (out.latency_ms >= roofline * (1 - 1e-9)).all()


def test_saved_as_json_with_a_manifest_and_reloaded(model, catalog, tmp_path):
    rows = measured(gemm_rows(60, "t4", 5), model, catalog, 5)
    adaptation = DeviceAdaptation.fit(model, rows, catalog)
    adaptation.save(tmp_path / "t4")
    files = sorted(p.name for p in (tmp_path / "t4").iterdir())
    assert files == ["adaptation.json", "manifest.json", "rows.json"]
    manifest = json.loads((tmp_path / "t4" / "manifest.json").read_text())
    assert manifest["training_samples"] == 60 and "log_flops" in manifest["feature_names"]
    assert manifest["training_data_hash"] == adaptation.data_hash()
    loaded = load_adaptations(tmp_path, catalog)["t4"]
    test = gemm_rows(30, "t4", 6)
    np.testing.assert_allclose(loaded.predict(model, test, catalog).latency_ms,
                               adaptation.predict(model, test, catalog).latency_ms, rtol=1e-5)
    assert loaded.for_model(model, catalog) is loaded  # fitted on this model's residuals: no refit


def test_refitted_for_another_base_model(model, catalog):
    rows = measured(gemm_rows(30, "t4", 7), model, catalog, 7)
    adaptation = DeviceAdaptation.fit(model, rows, catalog)
    stale = DeviceAdaptation("t4", "another-model", adaptation.classes, adaptation.rows)
    refitted = stale.for_model(model, catalog)
    assert refitted is not stale and refitted.base_model_hash == model.training_hash_


def test_the_predictor_uses_a_saved_adaptation_also_for_the_cpu(model, catalog):
    from perfmodel.predictor.gpu_iteration import DevicePredictor
    from perfmodel.predictor.placed import PlacementPredictor

    spec = JobSpec.from_options(hf_config=TINY_GPT2, batch_size=2, seq_len=32)
    before = DevicePredictor.load().predict(spec, "cpu")
    rows = pd.concat([gemm_rows(40, "cpu", 8),
                      pd.DataFrame({"op_class": "elementwise", "op_name": "add", "dtype": "fp32", "device": "cpu",
                                    "batch": [8, 64, 512, 2048] * 5, "hidden": [256, 1024, 4096, 768] * 5})])
    rows = rows.assign(latency_ms=model.predict(rows, catalog).latency_ms * 3.0)  # the CPU is 3x slower
    DeviceAdaptation.fit(model, rows, catalog).save(adaptations_dir() / "cpu")  # PERFMODEL_HOME: the test's
    predictor = DevicePredictor.load()
    assert isinstance(predictor.regressor, AdaptedRegressor) and predictor.regressor.devices == ("cpu",)
    after = predictor.predict(spec, "cpu")
    assert after.iter_time_ms > 1.5 * before.iter_time_ms
    placed = PlacementPredictor.load()
    assert placed._single(catalog["cpu"]) is placed.device  # the CPU is now one more device of the device model
    assert placed._single(catalog["t4"]) is placed.device


def test_a_class_that_did_not_beat_the_base_on_its_own_rows_is_left_out(model, catalog):
    rows = measured(gemm_rows(30, "t4", 10), model, catalog, 10)
    fitted = DeviceAdaptation.fit(model, rows, catalog)
    gate = fitted.classes["linear"].hyper
    assert gate["active"] == 1.0 and gate["loo_mape_pct"] < gate["base_mape_pct"]  # 30-80 % slower: learned
    off = dataclasses.replace(fitted.classes["linear"], hyper={**gate, "active": 0.0})
    inactive = DeviceAdaptation("t4", fitted.base_model_hash, {"linear": off}, fitted.rows)
    test = gemm_rows(20, "t4", 11)
    base = model.predict(test, catalog)
    out = inactive.predict(model, test, catalog)
    np.testing.assert_allclose(out.latency_ms, base.latency_ms)
    np.testing.assert_allclose(out.p90_ms, base.p90_ms)


def test_max_pools_and_transcendental_ops_are_told_apart_from_the_cheap_rows_of_the_same_bytes(model, catalog):
    """A CPU that runs its max pools 30x and its exponentials 5x the model's price, its additions and ReLUs at 0.6x:
    rows of the same shapes and bytes, told apart by their names (`max_pool`, `transcendental`): each kind held out
    is answered within 25 % of its own factor (the factors are 50x apart)."""
    rng = np.random.default_rng(0)
    names = {"add": 0.6, "relu": 0.6, "maxpool": 30.0, "gelu": 5.0, "silu": 5.0}

    def rows(n: int, seed: int) -> pd.DataFrame:
        r = np.random.default_rng(seed)
        frame = pd.DataFrame({"op_class": "elementwise", "op_name": r.choice(list(names), n), "dtype": "fp32",
                              "device": "cpu", "batch": 2 ** r.integers(6, 14, n), "hidden": 2 ** r.integers(4, 9, n)})
        base = model.predict(frame, catalog).latency_ms
        factor = frame["op_name"].map(names).to_numpy() * np.exp(rng.normal(0, 0.05, n))
        return frame.assign(latency_ms=base * factor)

    fitted = DeviceAdaptation.fit(model, rows(300, 1), catalog)
    assert fitted.classes["elementwise"].active
    test = rows(200, 2)
    ratio = test["latency_ms"] / fitted.predict(model, test, catalog).latency_ms
    for name in names:
        assert 0.75 < float(np.median(ratio[test["op_name"] == name])) < 1.25, name  # factors 0.6-30 apart


def conv_rows(n: int, seed: int, depthwise: bool, part: str | None) -> pd.DataFrame:
    """`n` conv2d rows on the CPU: depthwise ones as the lowering writes them (one input and one output channel,
    the groups folded into the batch) or dense ones, each of `part` (None: a row that names none, as a dense
    sweep's)."""
    r = np.random.default_rng(seed)
    channels = 1 if depthwise else 2 ** r.integers(4, 8, n)
    return pd.DataFrame({"op_class": "conv2d", "op_name": "conv2d", "dtype": "fp32", "device": "cpu",
                         "batch": 2 ** r.integers(5, 11, n) if depthwise else 2 ** r.integers(0, 4, n),
                         "in_channels": channels, "out_channels": channels,
                         "kernel_size": r.choice([3, 5], n), "input_size": r.choice([7, 14, 28, 56], n),
                         "stride": r.choice([1, 2], n), "padding": 1, "part": part})


def test_a_depthwise_convolutions_gradients_are_corrected_apart_from_its_forward_and_from_dense_ones(model, catalog,
                                                                                                   tmp_path):
    """A CPU whose depthwise weight gradients take 20x the model's price of their shape, its depthwise input
    gradients 4x, its forwards and dense convolutions 1.5x (the model prices a backward row as the forward of its
    shape). One GP for the class would fit their geometric mean; fitted apart, each part held out is answered within
    25 % of its own factor, and a dense convolution's gradient row keeps the dense rows' correction."""
    factors = {(True, "fwd"): 1.5, (True, "dX"): 4.0, (True, "dW"): 20.0, (False, None): 1.5}

    def rows(seed: int, n: int = 60) -> pd.DataFrame:
        frame = pd.concat([conv_rows(n, seed + i, depthwise, part) for i, (depthwise, part) in enumerate(factors)],
                          ignore_index=True)
        depthwise = frame["in_channels"] == 1
        factor = np.array([factors[(bool(d), p if d else None)] for d, p in zip(depthwise, frame["part"])])
        noise = np.exp(np.random.default_rng(seed).normal(0, 0.05, len(frame)))
        return frame.assign(latency_ms=model.predict(frame, catalog).latency_ms * factor * noise)

    fitted = DeviceAdaptation.fit(model, rows(1), catalog)
    assert set(fitted.classes) == {"conv2d", "conv2d:depthwise:dX", "conv2d:depthwise:dW"}
    assert all(a.active for a in fitted.classes.values())
    test = rows(100)
    ratio = test["latency_ms"] / fitted.predict(model, test, catalog).latency_ms
    for depthwise, part in factors:
        mask = (test["in_channels"] == 1) == depthwise
        mask &= test["part"].eq(part) if part else test["part"].isna()
        assert 0.75 < float(np.median(ratio[mask])) < 1.25, (depthwise, part)
    dense_gradients = conv_rows(60, 7, depthwise=False, part="dW")
    dense_ratio = fitted.predict(model, dense_gradients, catalog).latency_ms / model.predict(
        dense_gradients, catalog).latency_ms
    assert 1.2 < float(np.median(dense_ratio)) < 1.9  # the dense rows' 1.5x, not the depthwise weight gradient's 20x
    # the part is kept with the rows: saved, reloaded and refitted for another model, the groups are the same
    reloaded = DeviceAdaptation.load(fitted.save(tmp_path / "cpu").parent)
    np.testing.assert_allclose(reloaded.predict(model, test, catalog).latency_ms,
                               fitted.predict(model, test, catalog).latency_ms)
    assert set(DeviceAdaptation.fit(model, reloaded.rows.assign(device="cpu"), catalog).classes) == set(fitted.classes)


def test_rows_without_a_part_keep_one_gp_per_class_and_a_part_of_few_rows_stays_in_its_class(model, catalog):
    """Imported rows and a dense sweep's name no part: one GP per class, as before part groups. A part group with
    fewer rows than `MIN_GROUP_ROWS` is not fitted apart (its rows stay in the class's GP); a device's adaptation
    without a group answers that group's rows with its class's GP."""
    from perfmodel.regressors.adaptation import MIN_GROUP_ROWS

    dense = conv_rows(40, 1, depthwise=False, part=None)
    few = conv_rows(MIN_GROUP_ROWS - 1, 2, depthwise=True, part="dW")
    frame = pd.concat([dense, few], ignore_index=True)
    frame = frame.assign(latency_ms=model.predict(frame, catalog).latency_ms * 1.5)
    assert set(DeviceAdaptation.fit(model, frame.drop(columns=["part"]), catalog).classes) == {"conv2d"}
    fitted = DeviceAdaptation.fit(model, frame, catalog)
    assert set(fitted.classes) == {"conv2d"}
    gradients = conv_rows(20, 3, depthwise=True, part="dW")
    as_class = fitted.predict(model, gradients.assign(part=None), catalog).latency_ms
    np.testing.assert_allclose(fitted.predict(model, gradients, catalog).latency_ms, as_class)

"""xgb-device-ops beyond the estimator contract (test_contract.py), on synthetic ops whose latency follows a known
law of the device's spec sheet."""

import functools

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.core.errors import PerfmodelError
from perfmodel.features.device_ops import device_op_features
from perfmodel.hardware.catalog import load_catalog
from perfmodel.regressors.device_ops import (
    BANDWIDTH_MONOTONE,
    NARROW_DTYPES,
    NARROW_NEVER_DEARER,
    DeviceOpRegressor,
    base_ms,
)

TRAIN_DEVICES = ("t4", "v100-pcie-32gb", "a100-pcie-40gb", "p100-pcie-16gb")


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def _synthetic(catalog, devices, n=600, seed=0):
    """bmm and softmax rows; latency = 1.6 × (wave-quantised roofline) + 8 µs, the same efficiency law on every
    device, so a model that learned it transfers to a device it never saw."""
    rng = np.random.default_rng(seed)
    frames = []
    for device in devices:
        size = rng.integers(16, 2048, size=(n, 3))
        bmm = pd.DataFrame({"op_class": "bmm", "op_name": "bmm", "dtype": "fp32", "device": device,
                            "batch": rng.integers(1, 16, n), "m": size[:, 0], "n": size[:, 1], "k": size[:, 2]})
        soft = pd.DataFrame({"op_class": "softmax", "op_name": "softmax", "dtype": "fp32", "device": device,
                             "batch": rng.integers(1, 4096, n), "hidden": rng.integers(16, 8192, n)})
        frames += [bmm, soft]
    ops = pd.concat(frames, ignore_index=True)
    ops["latency_ms"] = 1.6 * base_ms(device_op_features(ops, catalog)) + 0.008
    return ops


def test_transfers_to_a_device_it_never_saw(catalog):
    model = DeviceOpRegressor(n_estimators=150).fit(_synthetic(catalog, TRAIN_DEVICES), catalog)
    held_out = _synthetic(catalog, ["v100-sxm2-32gb", "a100-pcie-80gb"], n=300, seed=1)
    prediction = model.predict(held_out, catalog)
    ape = np.abs(prediction.latency_ms - held_out["latency_ms"]) / held_out["latency_ms"]
    assert np.median(ape) < 0.05
    assert np.all(prediction.p10_ms <= prediction.latency_ms) and np.all(prediction.latency_ms <= prediction.p90_ms)


def test_flags_extrapolation(catalog):
    model = DeviceOpRegressor(n_estimators=30).fit(_synthetic(catalog, TRAIN_DEVICES, n=150), catalog)
    query = _synthetic(catalog, ["h100-sxm5", "v100-sxm2-32gb"], n=50, seed=2)
    query.loc[query.index[:5], "dtype"] = "fp16"
    a = model.predict(query, catalog)
    # H100 is faster than any training device; fp16 was never trained on
    assert a.extrapolated[query["device"].to_numpy() == "h100-sxm5"].all()
    assert a.extrapolated[:5].all()
    inside = (query["device"].to_numpy() == "v100-sxm2-32gb") & (query["dtype"].to_numpy() == "fp32")
    assert not a.extrapolated[inside].any()


def test_refuses_unknown_classes_and_bad_latencies(catalog):
    model = DeviceOpRegressor(n_estimators=10).fit(_synthetic(catalog, TRAIN_DEVICES[:2], n=50), catalog)
    with pytest.raises(PerfmodelError, match="no booster"):
        model.predict(pd.DataFrame({"op_class": ["conv2d"], "dtype": ["fp32"], "device": ["t4"]}), catalog)
    bad = _synthetic(catalog, TRAIN_DEVICES[:1], n=10).assign(latency_ms=0.0)
    with pytest.raises(PerfmodelError, match="positive"):
        DeviceOpRegressor(n_estimators=5).fit(bad, catalog)


def test_bounded_classes_never_beat_the_roofline_and_boosters_keep_their_own_features(catalog):
    from perfmodel.lowering.ops import op_roofline_ms as roofline_ms
    from perfmodel.regressors.device_ops import ROOFLINE_BOUNDED, class_features

    # measured 10 % above the roofline on the training GPUs: a model can only match it from above
    ops = _synthetic(catalog, TRAIN_DEVICES, n=200)
    ops["latency_ms"] = 1.1 * roofline_ms(ops, catalog)
    model = DeviceOpRegressor(n_estimators=40).fit(ops, catalog)
    for op_class, booster in model.boosters_.items():
        assert tuple(booster.feature_names) == class_features(op_class)
    query = _synthetic(catalog, ["h100-sxm5", "l4"], n=100, seed=3)
    predicted = model.predict(query, catalog).latency_ms
    bounded = query["op_class"].isin(ROOFLINE_BOUNDED).to_numpy()
    assert bounded.any()
    assert np.all(predicted[bounded] >= roofline_ms(query, catalog)[bounded] * (1 - 1e-9))


def _convs(catalog, devices, n=150, seed=0, **shape):
    """conv2d rows (square, NeuSight's schema) of random sizes; `shape` fixes columns (kernel_size, stride, dtype)."""
    rng = np.random.default_rng(seed)
    frames = [pd.DataFrame({"op_class": "conv2d", "op_name": "conv2d", "dtype": "fp32", "device": device,
                            "batch": rng.integers(8, 64, n), "in_channels": rng.integers(64, 512, n),
                            "out_channels": rng.integers(64, 512, n), "input_size": rng.integers(14, 56, n),
                            "kernel_size": 3, "stride": 1, "padding": 1}).assign(**shape) for device in devices]
    return pd.concat(frames, ignore_index=True)


def test_a_winograd_shaped_fp32_convolution_may_beat_its_direct_flops_but_never_its_least_arithmetic(catalog):
    """Measured at half the direct convolution's roofline on the training GPUs (as cuDNN's Winograd kernels run):
    a 3 x 3 stride-1 fp32 row is predicted below the direct FLOPs at the fp32 peak, never below a quarter of them
    (F(4x4, 3x3)) or its bytes at the bandwidth; a stride-2 row, a TF32 one or one on a Kepler GPU (no measurement
    shows it there) keeps the direct roofline."""
    from perfmodel.lowering.ops import WINOGRAD_MAX_REDUCTION, op_roofline_ms, op_work, row_architectures, winograd_rows
    from perfmodel.lowering.ops import device_peaks as peaks_of

    train = pd.concat([_convs(catalog, TRAIN_DEVICES), _convs(catalog, TRAIN_DEVICES, seed=1, stride=2)],
                      ignore_index=True)
    train["latency_ms"] = (np.where(winograd_rows(train, row_architectures(train, catalog)), 0.5, 1.3)
                           * op_roofline_ms(train, catalog))
    model = DeviceOpRegressor(n_estimators=60, floor_ms=0.0).fit(train, catalog)
    query = pd.concat([_convs(catalog, ["v100-sxm2-32gb", "a100-pcie-80gb"], n=60, seed=5),
                       _convs(catalog, ["v100-sxm2-32gb"], n=30, seed=6, stride=2),
                       _convs(catalog, ["a100-pcie-80gb"], n=30, seed=7).assign(math="tf32"),
                       _convs(catalog, ["k80"], n=30, seed=8)], ignore_index=True)
    predicted = model.predict(query, catalog).latency_ms
    direct = op_roofline_ms(query, catalog)
    winograd = winograd_rows(query, row_architectures(query, catalog))
    assert winograd.sum() == 120 and not winograd[120:].any()
    assert np.median(predicted[winograd] / direct[winograd]) < 0.8  # the measured speed carries over
    peak, bandwidth = peaks_of(query, catalog)
    work = op_work(query)
    least = np.maximum(work.flops / WINOGRAD_MAX_REDUCTION / (peak * 1e9),
                       (work.bytes_read + work.bytes_written) / (bandwidth * 1e9)) * 1e3
    assert np.all(predicted[winograd] >= least[winograd] * (1 - 1e-9))
    assert np.all(predicted[~winograd] >= direct[~winograd] * (1 - 1e-9))


def test_load_refuses_a_model_of_features_this_code_does_not_compute(catalog, tmp_path):
    import json

    model = DeviceOpRegressor(n_estimators=5).fit(_synthetic(catalog, TRAIN_DEVICES[:2], n=30), catalog)
    model.save(tmp_path / "m")
    manifest_path = tmp_path / "m" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["feature_names"] = [*manifest["feature_names"], "flux_capacitance"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(PerfmodelError, match="flux_capacitance"):
        DeviceOpRegressor.load(tmp_path / "m")


def test_kernels_a_library_launches_cost_their_share_of_the_eager_price_and_never_beat_the_roofline(catalog):
    from perfmodel.lowering.ops import op_roofline_ms as roofline_ms
    from perfmodel.regressors.device_ops import LIBRARY_LAUNCH_SHARE

    model = DeviceOpRegressor(n_estimators=40).fit(_synthetic(catalog, TRAIN_DEVICES, n=200), catalog)
    amd = next(name for name, hw in catalog.items() if hw.kind == "gpu" and hw.vendor == "AMD")
    query = _synthetic(catalog, ["v100-sxm2-32gb", "h100-sxm5", amd], n=100, seed=4)
    eager = model.predict(query.assign(launch="eager"), catalog)
    library = model.predict(query.assign(launch="library"), catalog)
    share = query["device"].map(lambda d: LIBRARY_LAUNCH_SHARE.get(catalog[d].vendor, 1.0)).to_numpy()
    floor = roofline_ms(query, catalog)
    # each kernel at its vendor's share of the eager price (AMD's at the eager price), unless the roofline binds
    assert np.allclose(library.latency_ms, np.maximum(eager.latency_ms * share, floor), rtol=1e-6)
    assert np.all(library.latency_ms >= floor * (1 - 1e-9))
    assert np.all(library.latency_ms[share == 1.0] == eager.latency_ms[share == 1.0])
    assert (share < 1.0).any() and np.all(library.latency_ms <= eager.latency_ms)
    # rows without a `launch` column are eager
    assert np.array_equal(model.predict(query, catalog).latency_ms, eager.latency_ms)


def _kernels(catalog, device, n, seed):
    """Random rows of every op class on `device`, from tiny (launch-bound) to large."""
    rng = np.random.default_rng(seed)
    size = np.exp2(rng.uniform(0, 12, size=(n, 3))).astype(int) + 1
    gemm = pd.DataFrame({"op_class": rng.choice(["bmm", "linear"], n), "op_name": "linear", "device": device,
                         "dtype": rng.choice(["fp32", "fp16"], n), "batch": rng.integers(1, 8, n),
                         "m": size[:, 0], "n": size[:, 1], "k": size[:, 2]})
    vector = pd.DataFrame({"op_class": rng.choice(["elementwise", "softmax", "layernorm"], n), "op_name": "add",
                           "device": device, "dtype": rng.choice(["fp32", "fp16"], n),
                           "batch": np.exp2(rng.uniform(0, 14, n)).astype(int), "hidden": size[:, 0]})
    conv = pd.DataFrame({"op_class": "conv2d", "op_name": "conv2d", "device": device, "dtype": "fp32",
                         "batch": rng.integers(1, 64, n), "in_channels": rng.choice([3, 64, 256], n),
                         "out_channels": rng.choice([64, 128, 512], n), "kernel_size": rng.choice([1, 3], n),
                         "input_size": rng.choice([7, 28, 56], n), "stride": 1, "padding": 1})
    return pd.concat([gemm, vector, conv], ignore_index=True)


@settings(max_examples=15, deadline=None)
@given(device=st.sampled_from(sorted(n for n, s in load_catalog().items() if s.kind == "gpu")),
       scale=st.floats(0.1, 0.95), seed=st.integers(0, 2**16))
def test_the_shipped_model_never_prices_a_kernel_cheaper_with_less_bandwidth(device, scale, seed):
    """Over random kernels of every class, catalog sheets and bandwidth cuts, the promoted per-op model (as served,
    with the roofline bound) prices every kernel at least as high on the sheet with less bandwidth: exactly, no
    slack (its normalisation only grows as the bandwidth falls and its boosters are monotone in every feature that
    moves with it)."""
    predictor = _shipped()
    sheet = predictor.catalog[device]
    more = sheet.model_copy(update={"name": "sheet-more", "aliases": ()})
    less = sheet.model_copy(update={"name": "sheet-less", "aliases": (),
                                    "memory_bandwidth_gb_s": sheet.memory_bandwidth_gb_s * scale})
    catalog = {**predictor.catalog, more.name: more, less.name: less}
    rows = _kernels(catalog, more.name, 40, seed)
    fast = predictor.regressor.predict(rows, catalog).latency_ms
    slow = predictor.regressor.predict(rows.assign(device=less.name), catalog).latency_ms
    assert np.all(slow >= fast * (1 - 1e-9)), rows[slow < fast * (1 - 1e-9)].to_dict("records")[:3]


@functools.cache
def _shipped():
    from perfmodel.predictor.gpu_iteration import DevicePredictor

    return DevicePredictor.load()


def test_a_fitted_model_is_monotone_in_the_bandwidth_whatever_its_training_rows_say(catalog):
    """Trained on rows where the low-bandwidth devices are the fast ones for small kernels (what a handful of GPUs
    can say by accident), the model still never prices a kernel cheaper with less bandwidth."""
    ops = _synthetic(catalog, TRAIN_DEVICES, n=200)
    bandwidth = ops["device"].map(lambda d: catalog[d].memory_bandwidth_gb_s)
    ops["latency_ms"] = ops["latency_ms"] + 0.00002 * bandwidth  # overhead that grows with the bandwidth
    model = DeviceOpRegressor(n_estimators=40).fit(ops, catalog)
    sheet = catalog["v100-sxm2-32gb"]
    sheets = [sheet.model_copy(update={"name": f"bw-{i}", "aliases": (), "memory_bandwidth_gb_s": bw})
              for i, bw in enumerate((150.0, 300.0, 600.0, 1200.0, 2400.0))]
    both = {**catalog, **{s.name: s for s in sheets}}
    query = _synthetic(catalog, ["v100-sxm2-32gb"], n=100, seed=3).drop(columns="latency_ms")
    prices = np.vstack([model.predict(query.assign(device=s.name), both).latency_ms for s in sheets])
    assert np.all(np.diff(prices, axis=0) <= 1e-12)
    assert model.domain_["op_classes"]["bmm"]["monotone_constraints"] == BANDWIDTH_MONOTONE


@settings(max_examples=15, deadline=None)
@given(device=st.sampled_from(sorted(n for n, s in load_catalog().items() if s.kind == "gpu")),
       dtype=st.sampled_from(sorted(NARROW_DTYPES)), seed=st.integers(0, 2**16))
def test_the_shipped_model_never_prices_a_narrow_memory_bound_kernel_above_its_fp32_twin(device, dtype, seed):
    """Over random element-wise, softmax and norm kernels of every catalog GPU, a kernel in a narrower type (fewer
    bytes, the same elements and math) is never priced above the same kernel in fp32, with its interval scaled along."""
    predictor = _shipped()
    rng = np.random.default_rng(seed)
    n = 60
    rows = pd.DataFrame({"op_class": rng.choice(sorted(NARROW_NEVER_DEARER), n),
                         "op_name": rng.choice(["relu", "addu", "mul", "add", "gelu", "mulu"], n),
                         "device": device, "batch": np.exp2(rng.uniform(0, 22, n)).astype(int),
                         "hidden": np.exp2(rng.uniform(3, 14, n)).astype(int)})
    narrow = predictor.regressor.predict(rows.assign(dtype=dtype), predictor.catalog)
    wide = predictor.regressor.predict(rows.assign(dtype="fp32"), predictor.catalog)
    assert np.all(narrow.latency_ms <= wide.latency_ms * (1 + 1e-9))
    assert np.all(narrow.p10_ms <= narrow.latency_ms) and np.all(narrow.latency_ms <= narrow.p90_ms)

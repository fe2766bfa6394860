"""Missing spec-sheet fields are filled (physics first, then the nearest device), never passed to a model as NaN."""

from __future__ import annotations

import pandas as pd
import pytest

from perfmodel.features.device_ops import DEVICE_FEATURES, device_op_features
from perfmodel.hardware.catalog import load_catalog
from perfmodel.hardware.impute import NEIGHBOUR_FIELDS, derived_boost_clock_mhz, imputed


def test_the_derived_clock_is_the_one_the_fp32_peak_implies():
    a100 = load_catalog()["a100-sxm4-80gb"]  # 108 SMs x 64 lanes x 2 x 1410 MHz = 19.5 TFLOP/s
    assert derived_boost_clock_mhz(a100) == pytest.approx(a100.boost_clock_mhz, rel=0.01)


@pytest.mark.parametrize("name", sorted(n for n, s in load_catalog().items() if s.kind == "gpu"))
def test_every_catalog_gpu_gets_every_device_feature(name):
    catalog = load_catalog()
    spec, origin = imputed(catalog[name], catalog.values())
    for field in NEIGHBOUR_FIELDS + ("boost_clock_mhz",):
        assert getattr(spec, field) is not None
        assert (getattr(catalog[name], field) is None) == (field in origin)
    ops = pd.DataFrame({"op_class": ["elementwise", "linear"], "kind": ["elementwise", "linear"], "m": [1, 512],
                        "n": [1, 512], "k": [0, 512], "batch": [1, 1], "dtype": ["fp32", "fp16"], "device": name})
    features = device_op_features(ops, catalog)
    assert not features[list(DEVICE_FEATURES) + ["working_set_over_l2", "elements_per_core"]].isna().any().any()


def test_a_device_without_l2_gets_the_features_of_its_nearest_neighbour():
    catalog = load_catalog()
    blank = catalog["h100-sxm5"].model_copy(update={"name": "h100-no-l2", "aliases": (), "l2_cache_mb": None})
    spec, origin = imputed(blank, catalog.values())
    assert spec.l2_cache_mb == catalog["h100-sxm5"].l2_cache_mb and "h100-sxm5" in origin["l2_cache_mb"]
    ops = pd.DataFrame({"op_class": ["elementwise"], "kind": ["elementwise"], "m": [4096], "n": [4096], "k": [0],
                        "batch": [1], "dtype": ["fp32"]})
    both = {**catalog, "h100-no-l2": blank}
    with_l2 = device_op_features(ops.assign(device="h100-sxm5"), both)
    without = device_op_features(ops.assign(device="h100-no-l2"), both)
    pd.testing.assert_frame_equal(with_l2, without)


def test_a_field_a_sku_lacks_comes_from_its_dies_sku_of_the_same_compute():
    """A GH200 gives no board power: it takes the H100 SXM's (same die, same peaks, 700 W), not the nearest part by
    bandwidth (a 400 W H100 NVL), so the learned models see one device at one compute, memory apart."""
    catalog = load_catalog()
    for name in ("gh200-96gb", "gh200-144gb"):
        filled, origin = imputed(catalog[name], catalog.values())
        assert filled.tdp_w == catalog["h100-sxm5"].tdp_w == 700.0
        assert "GH100" in origin["tdp_w"]
    # a part whose die has no other SKU in the catalog keeps the nearest-device rule
    _, origin = imputed(catalog["a16"], catalog.values())
    assert "nearest catalog device" in origin["l2_cache_mb"]


@pytest.mark.parametrize("name", ["a16", "rtx-a4500", "h100-sxm5"])
def test_a_sheet_with_other_bandwidth_is_imputed_as_the_same_device(name):
    """Whatever a sheet's bandwidth, its missing fields come from the same device: the per-op model is monotone in
    the bandwidth only if nothing else moves with it."""
    catalog = load_catalog()
    sheet = catalog[name].model_copy(update={"name": "my-sheet", "aliases": (), "l2_cache_mb": None, "tdp_w": None})
    filled = [imputed(sheet.model_copy(update={"memory_bandwidth_gb_s": sheet.memory_bandwidth_gb_s * scale}),
                      catalog.values())[0] for scale in (0.25, 0.5, 1.0, 2.0, 8.0)]
    assert len({(f.l2_cache_mb, f.tdp_w, f.fp32_cores_per_cu) for f in filled}) == 1

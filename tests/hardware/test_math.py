"""The peak each math reaches on a device: the datasheet's, less what the warp schedulers cannot issue to."""

from __future__ import annotations

import pytest

from perfmodel.hardware.catalog import get_accelerator, load_catalog
from perfmodel.hardware.math import (
    MATHS,
    TENSOR_CORE_ARCHITECTURES,
    fp32_issue_fraction,
    has_tensor_cores,
    peak_gflops,
    tensor_peaks_given,
)


def test_keplers_fp32_peak_is_what_four_warp_schedulers_of_32_lanes_issue_to():
    k80 = get_accelerator("k80")
    assert k80.fp32_cores_per_cu == 192
    assert fp32_issue_fraction(k80) == pytest.approx(128 / 192)
    for gemm in (True, False):
        assert peak_gflops(k80, "fp32", gemm) == pytest.approx(k80.peak_fp32_gflops * 128 / 192)
    # no tensor cores and no fast fp16 on Kepler: every math runs at that rate
    assert {round(peak_gflops(k80, math), 6) for math in MATHS} == {round(k80.peak_fp32_gflops * 2 / 3, 6)}


def test_a_sheet_that_names_no_architecture_is_capped_by_its_lanes_per_sm():
    """A user's spec sheet of a Kepler die that leaves out `architecture` (or its lanes, imputed from the nearest
    catalog device) is priced as the catalog's K80, not at the datasheet peak."""
    from perfmodel.hardware.impute import imputed

    k80 = get_accelerator("k80")
    sheet = k80.model_copy(update={"name": "tesla-k80-die", "architecture": None, "fp32_cores_per_cu": None})
    filled, origin = imputed(sheet, load_catalog().values())
    assert "fp32_cores_per_cu" in origin and filled.fp32_cores_per_cu == 192
    assert peak_gflops(filled, "fp32") == pytest.approx(peak_gflops(k80, "fp32"))
    assert peak_gflops(sheet.model_copy(update={"fp32_cores_per_cu": 192}), "fp32", gemm=False) == pytest.approx(
        k80.peak_fp32_gflops * 128 / 192)


def test_every_other_gpu_keeps_its_datasheet_fp32_peak():
    for name, spec in load_catalog().items():
        if (spec.architecture or "").lower() == "kepler":
            continue
        assert fp32_issue_fraction(spec) == 1.0, name
        assert peak_gflops(spec, "fp32", gemm=False) == spec.peak_fp32_gflops, name



def test_what_the_peaks_show_agrees_with_the_architecture_of_every_catalog_gpu():
    """A spec sheet that names no architecture (or one newer than the table) has tensor cores exactly when its peaks
    show them: the rule gives every catalog GPU what its architecture gives it."""
    for name, spec in load_catalog().items():
        if spec.kind != "gpu":
            continue
        assert tensor_peaks_given(spec) == ((spec.architecture or "") in TENSOR_CORE_ARCHITECTURES), name
        for architecture in (None, "rubin"):
            sheet = spec.model_copy(update={"architecture": architecture})
            assert has_tensor_cores(sheet) == has_tensor_cores(spec), (name, architecture)


@pytest.mark.parametrize(("peaks", "tensor"), [
    ({}, False),
    ({"peak_fp16_gflops": 2 * 20e3}, False),  # packed half vectors: Pascal, GCN
    ({"peak_fp16_gflops": 8 * 20e3}, True),  # Volta / Turing tensor cores
    ({"peak_bf16_gflops": 2 * 20e3}, True),  # only matrix units have a bf16 peak
    ({"peak_tf32_gflops": 20e3}, True),
])
def test_a_sheet_without_architecture_is_read_from_its_peaks(peaks, tensor):
    sheet = get_accelerator("a100-sxm4-40gb").model_copy(update={
        "name": "acme-x1", "architecture": None, "peak_fp32_gflops": 20e3, "peak_tf32_gflops": None,
        "peak_fp16_gflops": None, "peak_bf16_gflops": None, "peak_fp8_gflops": None, **peaks})
    assert has_tensor_cores(sheet) is tensor
    assert has_tensor_cores(sheet.model_copy(update={"architecture": "pascal"})) is False  # a named one decides

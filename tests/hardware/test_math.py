"""The peak each math reaches on a device: the datasheet's, less what the warp schedulers cannot issue to."""

from __future__ import annotations

import pytest

from perfmodel.hardware.catalog import get_accelerator, load_catalog
from perfmodel.hardware.math import MATHS, fp32_issue_fraction, peak_gflops


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


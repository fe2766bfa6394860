"""Spec sheets of custom accelerators: units converted, ranges and required fields checked (the error names the
field), catalog names refused, and the live catalog the predictions use."""

from __future__ import annotations

import pytest

from perfmodel.hardware.catalog import get_accelerator, load_catalog
from perfmodel.hardware.custom import (
    CUSTOM_REASON,
    AcceleratorClash,
    LiveCatalog,
    SpecSheetError,
    custom_reasons,
    is_custom,
    parse_spec_sheet,
    validate_spec_sheet,
)

SHEET = {"name": "acme-x1", "kind": "gpu", "peak_fp32_gflops": "60 TFLOP/s", "memory_bandwidth_gb_s": "3.35 TB/s",
         "memory_gb": "80 GiB", "compute_units": 120, "boost_clock_mhz": "1.98 GHz", "tdp_w": "0.7 kW",
         "node_network_gbit_s": "3.2 Tb/s"}


def test_units_convert_to_the_fields_units():
    spec = validate_spec_sheet(SHEET)
    assert spec.peak_fp32_gflops == 60_000 and spec.memory_bandwidth_gb_s == pytest.approx(3350)
    assert spec.memory_gb == pytest.approx(80 * 2**30 / 1e9) and spec.boost_clock_mhz == pytest.approx(1980)
    assert spec.tdp_w == pytest.approx(700) and spec.node_network_gbit_s == pytest.approx(3200)
    assert is_custom(spec) and custom_reasons(spec) == [CUSTOM_REASON]
    assert spec.source == "custom accelerator: spec sheet given by the user"
    assert not any(is_custom(entry) for entry in load_catalog().values())


@pytest.mark.parametrize(("change", "field"), [
    ({"memory_gb": "80 GB/s"}, "memory_gb"),
    ({"memory_bandwidth_gb_s": "fast"}, "memory_bandwidth_gb_s"),
    ({"compute_units": None}, "compute_units"),
    ({"peak_fp32_gflops": 0}, "peak_fp32_gflops"),
    ({"memory_bandwidth_gb_s": 1e12}, "memory_bandwidth_gb_s"),
    ({"kind": "tpu"}, "kind"),
    ({"name": "--"}, "name"),
])
def test_bad_sheets_name_the_field(change, field):
    with pytest.raises(SpecSheetError) as caught:
        validate_spec_sheet({**SHEET, **change})
    assert caught.value.loc[0] == field and str(caught.value).startswith(field)


def test_names_the_catalog_uses_are_refused():
    for name in ("H100", "nvidia a100-sxm4-80gb", "h100-sxm5"):
        with pytest.raises(AcceleratorClash):
            validate_spec_sheet({**SHEET, "name": name})
    with pytest.raises(AcceleratorClash, match="ambiguous"):
        validate_spec_sheet({**SHEET, "aliases": ["RTX 6000"]})


def test_yaml_and_json_sheets_parse():
    assert parse_spec_sheet("name: x\nmemory_gb: 80\n") == {"name": "x", "memory_gb": 80}
    assert parse_spec_sheet(b'{"name": "x"}') == {"name": "x"}
    with pytest.raises(SpecSheetError):
        parse_spec_sheet("[1, 2]")


def test_the_live_catalog_resolves_custom_entries_and_refreshes_whole():
    spec = validate_spec_sheet({**SHEET, "aliases": ["ACME X1"]})
    catalog = LiveCatalog(load_catalog())
    assert "acme-x1" not in catalog
    assert catalog.refresh([spec]) and get_accelerator("acme x1", catalog) == spec
    assert not catalog.refresh([spec]) and catalog.custom() == [spec]
    assert get_accelerator("h100", catalog).name == "h100-sxm5"
    catalog.refresh([])
    assert "acme-x1" not in catalog

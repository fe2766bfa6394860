"""Spec sheets of custom accelerators: units converted, ranges and required fields checked (the error names the
field), catalog names refused, and the live catalog the predictions use."""

from __future__ import annotations

import pytest

from perfmodel.hardware.catalog import get_accelerator, load_catalog
from perfmodel.hardware.custom import (
    CUSTOM_REASON,
    MIN_GPU_VALUES,
    AcceleratorClash,
    LiveCatalog,
    SpecSheetError,
    check_plausible,
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
    assert spec.memory_gb == 80 and spec.boost_clock_mhz == pytest.approx(1980)  # memory is binary: GB = GiB
    assert validate_spec_sheet({**SHEET, "memory_gb": "80 GB"}).memory_bytes == 80 * 2**30
    assert validate_spec_sheet({**SHEET, "memory_gb": "0.5 TB"}).memory_gb == 512
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


def test_a_misspelled_field_is_named_with_the_close_known_one_even_when_required_fields_are_missing():
    """`memory_bandwidth` for `memory_bandwidth_gb_s`, and `compute_units` left out: one error names the unknown
    field, the field it is close to, and the missing ones (before, only the missing ones)."""
    sheet = {k: v for k, v in SHEET.items() if k not in ("memory_bandwidth_gb_s", "compute_units")}
    with pytest.raises(SpecSheetError) as caught:
        validate_spec_sheet({**sheet, "memory_bandwidth": 3000, "clock_ghz": 2})
    assert caught.value.loc == ("memory_bandwidth",)
    message = str(caught.value)
    assert "unknown fields memory_bandwidth (did you mean memory_bandwidth_gb_s?), clock_ghz" in message
    assert "a gpu needs memory_bandwidth_gb_s, compute_units (missing)" in message
    with pytest.raises(SpecSheetError, match=r"^xyz: unknown field xyz$"):  # nothing close: no suggestion
        validate_spec_sheet({**SHEET, "xyz": 1})


@pytest.mark.parametrize(("field", "value", "unit"), [
    ("peak_fp32_gflops", 60, "GFLOP/s"),  # meant 60 TFLOP/s
    ("peak_bf16_gflops", 80, "GFLOP/s"),
    ("memory_bandwidth_gb_s", 3, "GB/s"),  # meant 3 TB/s
    ("memory_gb", 0.08, "GB"),
])
def test_unit_slips_below_any_gpu_are_refused_naming_the_field_value_and_unit(field, value, unit):
    with pytest.raises(SpecSheetError) as caught:
        validate_spec_sheet({**SHEET, field: value})
    assert caught.value.loc == (field,)
    assert str(caught.value).startswith(f"{field}: {value:g} {unit} is below any GPU's")
    assert f"the field is in {unit}" in str(caught.value)


def test_every_gpu_of_the_shipped_catalog_is_within_the_plausible_ranges():
    """The bounds never refuse a real part: every catalogued GPU passes them (and is above each lower bound)."""
    gpus = [spec for spec in load_catalog().values() if spec.kind == "gpu"]
    assert len(gpus) > 50
    for spec in gpus:
        check_plausible(spec)
        for field, (minimum, _unit, _larger) in MIN_GPU_VALUES.items():
            assert getattr(spec, field) is None or getattr(spec, field) >= minimum, (spec.name, field)
    assert {"peak_fp32_gflops", "peak_fp16_gflops", "peak_tf32_gflops", "peak_fp8_gflops", "memory_bandwidth_gb_s",
            "memory_gb"} <= set(MIN_GPU_VALUES)

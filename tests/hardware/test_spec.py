import pytest
from pydantic import ValidationError

from perfmodel.hardware.spec import HardwareSpec

BASE = dict(name="x-gpu", kind="gpu", peak_fp32_gflops=1000.0, memory_bandwidth_gb_s=500.0, memory_gb=16.0,
            compute_units=10, source="test")


def test_datasheet_fields_are_optional():
    spec = HardwareSpec(**BASE)
    assert spec.peak_tf32_gflops is None and spec.architecture is None and spec.interconnect_bidir_gb_s is None
    full = HardwareSpec(**BASE, architecture="hopper", release_year=2022, form_factor="sxm", peak_tf32_gflops=2e3,
                        peak_fp16_gflops=4e3, peak_bf16_gflops=4e3, peak_fp8_gflops=8e3, peak_fp64_gflops=500.0,
                        peak_fp32_matrix_gflops=2e3, fp32_cores_per_cu=128, boost_clock_mhz=1980.0,
                        base_clock_mhz=1590.0, memory_type="HBM3", tdp_w=700.0, pcie_gen=5, interconnect="nvlink4",
                        interconnect_bidir_gb_s=900.0, peer_to_peer="nvlink", node_devices=8,
                        node_network_gbit_s=3200.0)
    assert HardwareSpec.model_validate(full.model_dump(mode="json")) == full


@pytest.mark.parametrize("field,value", [
    ("peak_tf32_gflops", 0.0), ("peak_bf16_gflops", -1.0), ("peak_fp8_gflops", 0), ("tdp_w", -5.0),
    ("boost_clock_mhz", 0.0), ("fp32_cores_per_cu", 0), ("interconnect_bidir_gb_s", -1.0), ("pcie_gen", 0),
    ("release_year", 1066), ("l2_cache_mb", 0.0), ("no_such_field", 1),
    ("peer_to_peer", "infiniband"), ("node_devices", 0), ("node_network_gbit_s", 0.0),
])
def test_numbers_must_be_positive_and_fields_known(field, value):
    with pytest.raises(ValidationError):
        HardwareSpec(**BASE, **{field: value})

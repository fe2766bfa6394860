import numpy as np
import pandas as pd
import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.features.device_ops import DEVICE_IDENTITY_FEATURES, DEVICE_OP_FEATURES, device_op_features
from perfmodel.hardware.catalog import load_catalog
from perfmodel.lowering.ops import op_roofline_ms as roofline_ms
from perfmodel.lowering.ops import op_work


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def _ops(**columns):
    n = max(len(v) for v in columns.values() if isinstance(v, list))
    return pd.DataFrame({k: v if isinstance(v, list) else [v] * n for k, v in columns.items()})


def test_gemm_flops_are_2mnk():
    ops = _ops(op_class=["bmm", "linear"], op_name=["bmm", "linear"], dtype="fp32", batch=[3, 1], m=[64, 128],
               n=[32, 256], k=[16, 512])
    work = op_work(ops)
    np.testing.assert_array_equal(work.flops, [2 * 3 * 64 * 32 * 16, 2 * 128 * 256 * 512])
    # linear reads its input and weight once, writes its output
    assert work.bytes_read[1] == 4 * (128 * 512 + 256 * 512) and work.bytes_written[1] == 4 * 128 * 256
    # what each writes, in elements: bytes written over the element size, whatever the dtype
    np.testing.assert_array_equal(work.elements_written, [3 * 64 * 32, 128 * 256])
    half = op_work(ops.assign(dtype="fp16"))
    np.testing.assert_array_equal(half.elements_written, work.elements_written)
    np.testing.assert_array_equal(half.bytes_written * 2, work.bytes_written)


def test_conv_flops_match_the_implicit_gemm():
    ops = _ops(op_class=["conv2d"], op_name="conv", dtype="fp32", batch=2, in_channels=3, out_channels=8,
               kernel_size=3, input_size=32, stride=1, padding=1)
    assert op_work(ops).flops[0] == 2 * (2 * 32 * 32) * 8 * (3 * 3 * 3)


def test_binary_elementwise_reads_twice_what_a_unary_one_reads():
    ops = _ops(op_class="elementwise", op_name=["add", "relu"], dtype="fp32", batch=4, hidden=1024)
    work = op_work(ops)
    assert work.bytes_read[0] == 2 * work.bytes_read[1] == 2 * 4 * 4 * 1024
    np.testing.assert_array_equal(work.elements_written, [4 * 1024, 4 * 1024])


def test_half_precision_halves_bytes_and_uses_the_tensor_peak(catalog):
    ops = _ops(op_class="linear", op_name="linear", dtype=["fp32", "fp16"], batch=1, m=4096, n=4096, k=4096,
               device="a100-sxm4-80gb")
    work = op_work(ops)
    assert work.bytes_read[0] == 2 * work.bytes_read[1]
    features = device_op_features(ops, catalog)
    assert features["peak_gflops"][1] > 10 * features["peak_gflops"][0] / 2  # 312 vs 19.5 TFLOP/s


def test_features_are_named_ordered_and_finite_where_the_spec_is_complete(catalog):
    ops = _ops(op_class=["bmm", "softmax", "layernorm"], op_name=["bmm", "softmax", "ln"], dtype="fp32", batch=8,
               m=[128, 0, 0], n=[128, 0, 0], k=[64, 0, 0], hidden=[0, 512, 1024], device="v100-pcie-32gb")
    features = device_op_features(ops, catalog)
    assert tuple(features.columns) == DEVICE_OP_FEATURES
    # peak per watt is a tensor-core feature: missing (NaN, XGBoost's "missing") on these fp32 CUDA-core rows
    assert np.isfinite(features.drop(columns="log_peak_per_watt").to_numpy()).all()
    assert features["log_peak_per_watt"].isna().all() and (features["tensor_math"] == 0).all()
    assert set(DEVICE_IDENTITY_FEATURES) <= set(DEVICE_OP_FEATURES)


def test_tensor_core_rows_carry_their_math_peak_per_watt(catalog):
    ops = _ops(op_class="linear", op_name="linear", dtype=["fp16", "fp32", "fp32"], math=["fp16", "fp32", "tf32"],
               batch=1, m=4096, n=4096, k=4096, device="a100-sxm4-80gb")
    features = device_op_features(ops, catalog)
    assert list(features["tensor_math"]) == [1.0, 0.0, 1.0]
    a100 = catalog["a100-sxm4-80gb"]
    assert features["log_peak_per_watt"].iloc[0] == pytest.approx(np.log2(a100.peak_fp16_gflops / a100.tdp_w))
    assert features["log_peak_per_watt"].iloc[2] == pytest.approx(np.log2(a100.peak_tf32_gflops / a100.tdp_w))
    # TF32 reads fp32 tensors at the TF32 peak: the same bytes as fp32, 8x the compute rate
    assert features["log_memory_ms"].iloc[1] == features["log_memory_ms"].iloc[2]
    assert features["log_compute_ms"].iloc[1] - features["log_compute_ms"].iloc[2] == pytest.approx(
        np.log2(a100.peak_tf32_gflops / a100.peak_fp32_gflops))


def test_a_faster_device_has_a_shorter_roofline(catalog):
    ops = _ops(op_class="bmm", op_name="bmm", dtype="fp32", batch=16, m=1024, n=1024, k=1024,
               device=["t4", "a100-pcie-40gb", "h100-sxm5"])
    t4, a100, h100 = roofline_ms(ops, catalog)
    assert t4 > a100 > h100


def test_unknown_op_class_dtype_or_device_is_refused(catalog):
    with pytest.raises(PerfmodelError, match="op class"):
        op_work(_ops(op_class=["fft"], dtype="fp32"))
    with pytest.raises(PerfmodelError, match="dtype"):
        op_work(_ops(op_class=["bmm"], dtype="fp64"))
    with pytest.raises(PerfmodelError, match="catalog"):
        device_op_features(_ops(op_class=["bmm"], dtype="fp32", batch=1, m=2, n=2, k=2, device="tpu-v9"), catalog)


def test_rocm_flags_the_software_stack_from_the_catalog_vendor(catalog):
    ops = _ops(op_class="softmax", op_name="softmax", dtype="fp32", batch=8, hidden=512,
               device=["mi210", "a100-pcie-40gb"])
    features = device_op_features(ops, catalog)
    assert features["rocm"].tolist() == [1.0, 0.0]

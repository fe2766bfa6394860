"""DeepBench: GEMM, conv (forward and both backward passes), RNN and all-reduce rows of the tidy extracts."""

from __future__ import annotations

import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.importers import ImportStats, import_deepbench

GEMM = "tidy/deepbench_dense_matrix_multiplication.csv"
CONV = "tidy/deepbench_convolution.csv"
LSTM = "tidy/deepbench_recurrent_layers_lstm.csv"
ALLREDUCE = "tidy/deepbench_all_reduce.csv"


def _by_row(root, catalog, name, stats=None):
    found = {}
    for record in import_deepbench(root, catalog=catalog, files=[name], stats=stats):
        found.setdefault(record.source_row, []).append(record)
    return found


def test_gemm_rows(deepbench_root, catalog):
    rows = _by_row(deepbench_root, catalog, GEMM)
    (v100,) = rows[2380]  # the PROVENANCE example: V100 FP32, DeepSpeech 1760 x 16 x 1760, 0.038 ms
    assert v100.model_dump(include={"device", "op_class", "dtype", "phase", "batch", "m", "n", "k", "latency_ms"}) == {
        "device": "test-v100-sxm2", "op_class": "gemm", "dtype": "fp32", "phase": "forward", "batch": 1, "m": 1760,
        "n": 16, "k": 1760, "latency_ms": 0.038}
    assert v100.extra["sheet"] == "Results_FP32" and v100.extra["transpose_a"] == "N"
    assert v100.extra["source_csv"] == "results/train/csv/DeepBench_NV_V100__Results_FP32.csv"
    dtypes = {(r.extra["sheet"], r.dtype) for records in rows.values() for r in records if r.device == "test-t4"}
    assert dtypes == {("Results_FP32", "fp32"), ("Results_-_FP16_ip_Mixed_math", "fp16"),
                      ("Results_-_Mixed_Precision", "int8")}


def test_conv_rows_give_one_record_per_pass_with_non_square_shapes(deepbench_root, catalog):
    rows = _by_row(deepbench_root, catalog, CONV)
    # V100 fp16 DeepSpeech layer: W 700, H 161, C 1, N 4, K 32, R 5 x S 20, stride 2, no padding; the backward
    # pass wrt inputs is "N/A*" in the sheet (the first layer needs none), so two records
    records = {r.phase: r for r in rows[1570]}
    assert set(records) == {"forward", "backward_weight"}
    assert records["forward"].latency_ms == 0.591 and records["backward_weight"].latency_ms == 1.028
    conv = records["forward"]
    assert conv.model_dump(include={"dtype", "batch", "in_channels", "out_channels", "input_height", "input_width",
                                    "input_size", "kernel_height", "kernel_width", "kernel_size", "stride",
                                    "padding"}) == {
        "dtype": "fp16", "batch": 4, "in_channels": 1, "out_channels": 32, "input_height": 161, "input_width": 700,
        "input_size": None, "kernel_height": 5, "kernel_width": 20, "kernel_size": None, "stride": 2, "padding": 0}
    phases = {r.phase for records in rows.values() for r in records}
    assert phases == {"forward", "backward_data", "backward_weight"}


def test_rnn_phases_and_precisions(deepbench_root, catalog):
    rows = _by_row(deepbench_root, catalog, LSTM)
    (inference,) = rows[15]  # 1080Ti inference sheet: "Input" 512, fp32 RNNs ("single precision")
    assert (inference.op_name, inference.dtype, inference.phase, inference.hidden, inference.batch,
            inference.seq_len, inference.latency_ms) == ("lstm", "fp32", "forward", 512, 1, 25, 0.89)
    pseudo_fp16 = {r.phase: r.latency_ms for r in rows[170]}  # P100 "pseudo FP16": one backward time
    assert pseudo_fp16 == {"forward": 1.371, "backward": 1.272}
    assert {r.dtype for r in rows[170]} == {"fp16"}


def test_allreduce_rows_and_empty_sheets(deepbench_root, catalog):
    stats = ImportStats()
    rows = _by_row(deepbench_root, catalog, ALLREDUCE, stats=stats)
    (p100,) = rows[105]  # 100k floats over 2 P100s, NCCL 2.0 MPI
    assert (p100.op_class, p100.device, p100.message_bytes, p100.world_size, p100.nodes, p100.dtype) == (
        "allreduce", "test-p100", 400_000, 2, None, "fp32")
    assert p100.latency_ms == pytest.approx(0.101934, rel=1e-5) and p100.extra["algorithm"] == "NCCL 2.0 MPI"
    assert stats.skipped["no latency"] == 50  # the V100 and T4 all-reduce sheets are empty
    assert stats.unknown_devices["NV_M40"] == 35 and stats.unknown_devices["IA_KNL7250"] == 35


def test_not_deepbench_is_a_user_error(tmp_path):
    (tmp_path / "tidy").mkdir()
    with pytest.raises(PerfmodelError, match="does not look like the deepbench dataset"):
        import_deepbench(tmp_path)

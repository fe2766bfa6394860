"""Imported op measurements in the store: added in one transaction, never twice, read back as a DataFrame."""

from __future__ import annotations

import pandas as pd
import pytest

from perfmodel.profilers.external import OpMeasurement
from perfmodel.store import ProfileStore


def _bmm(row: int, device: str = "t4", latency_ms: float = 0.5, source_file: str = "collect/bmm/T4.csv.gz",
         **extra) -> OpMeasurement:
    return OpMeasurement(source="neusight", source_file=source_file, source_row=row, device=device,
                         op_class="bmm", op_name="bmm", dtype="fp32", phase="forward", batch=row + 1, m=64, n=32,
                         k=2**33, latency_ms=latency_ms, extra={"kernel_name": "volta_sgemm_64x64_nn", **extra})


def _conv(row: int, phase: str) -> OpMeasurement:
    return OpMeasurement(source="deepbench", source_file="tidy/deepbench_convolution.csv", source_row=row,
                         device="v100-sxm2-32gb", op_class="conv2d", op_name="conv2d", dtype="fp16", phase=phase,
                         batch=4, in_channels=1, out_channels=32, input_height=161, input_width=700,
                         kernel_height=5, kernel_width=20, stride_height=2, stride_width=2, stride=2,
                         padding_height=0, padding_width=0, padding=0, latency_ms=1.25)


def _allreduce(row: int) -> OpMeasurement:
    return OpMeasurement(source="vidur", source_file="data/profiling/network/a100_dgx/all_reduce.csv.gz",
                         source_row=row, device="a100-sxm4-80gb", op_class="allreduce", op_name="all_reduce",
                         dtype="fp16", phase="forward", message_bytes=2**40, world_size=16, nodes=2,
                         latency_ms=2.886)


def test_measurements_round_trip_as_a_dataframe(store):
    records = [*(_bmm(i) for i in range(3)), _conv(0, "forward"), _conv(0, "backward_weight"), _allreduce(7)]
    assert store.add_op_measurements(records) == 6
    assert store.count_op_measurements() == 6
    frame = store.op_measurements()
    assert len(frame) == 6 and frame["uid"].is_unique
    for field in OpMeasurement.model_fields:
        assert field in frame.columns
    fields = [f for f in OpMeasurement.model_fields if f != "extra"]
    back = [OpMeasurement.model_validate({**{f: None if pd.isna(row[f]) else row[f] for f in fields},
                                          "extra": row["extra"]}) for row in frame.to_dict("records")]
    assert back == records  # in import order, every field as given (big integers included)
    assert str(frame["m"].dtype) == "Int64" and frame["latency_ms"].dtype == float
    assert frame.loc[0, "extra"] == {"kernel_name": "volta_sgemm_64x64_nn"}


def test_filters_take_a_value_or_a_list(store):
    store.add_op_measurements([_bmm(0), _bmm(1, device="p4"), _conv(0, "forward"), _conv(0, "backward_data"),
                               _allreduce(0)])
    assert store.count_op_measurements(device="t4") == 1
    assert store.count_op_measurements(device=["t4", "p4"], op_class="bmm") == 2
    assert store.count_op_measurements(op_class="conv2d", phase="backward_data") == 1
    assert store.count_op_measurements(source="vidur", dtype="fp16") == 1
    assert store.count_op_measurements(source="vidur", dtype="fp32") == 0
    assert list(store.op_measurements(op_class=("conv2d", "allreduce"))["op_class"]) == ["conv2d", "conv2d",
                                                                                           "allreduce"]
    assert "extra" not in store.op_measurements(extra=False).columns
    assert store.op_measurements(device="nowhere").empty
    assert store.op_measurement_counts() == [("deepbench", "v100-sxm2-32gb", "conv2d", 2),
                                             ("neusight", "p4", "bmm", 1), ("neusight", "t4", "bmm", 1),
                                             ("vidur", "a100-sxm4-80gb", "allreduce", 1)]


def test_adding_the_same_measurements_again_adds_nothing(store):
    records = [_bmm(i) for i in range(5)]
    assert store.add_op_measurements(records) == 5
    assert store.add_op_measurements(records) == 0
    assert store.add_op_measurements([*records, _bmm(5), _bmm(5)]) == 1  # new ones only, each once
    assert store.count_op_measurements() == 6


def test_the_identity_is_source_file_row_op_and_phase(store):
    assert store.add_op_measurements([_bmm(0)]) == 1
    assert store.add_op_measurements([_bmm(0, latency_ms=9.0, device="p4")]) == 0  # same measurement: kept as is
    assert store.add_op_measurements([_bmm(0, source_file="other.csv")]) == 1
    assert store.add_op_measurements([_conv(0, "forward"), _conv(0, "backward_data")]) == 2
    assert store.op_measurements(source="neusight")["latency_ms"].tolist() == [0.5, 0.5]


def test_replace_drops_what_the_files_held_first(store):
    store.add_op_measurements([_bmm(i) for i in range(4)] + [_bmm(0, source_file="keep.csv")])
    assert store.add_op_measurements([_bmm(0, latency_ms=2.0), _bmm(1, latency_ms=2.0)], replace=True) == 2
    frame = store.op_measurements()
    assert sorted(frame["latency_ms"].tolist()) == [0.5, 2.0, 2.0]  # rows 2 and 3 of the file are gone
    assert set(frame["source_file"]) == {"collect/bmm/T4.csv.gz", "keep.csv"}


def test_a_failed_import_adds_nothing(store):
    def records():
        yield from (_bmm(i) for i in range(2500))  # more than one insert chunk
        raise RuntimeError("parser crashed")

    with pytest.raises(RuntimeError, match="parser crashed"):
        store.add_op_measurements(records())
    assert store.count_op_measurements() == 0


def test_an_empty_store_has_no_measurements(store):
    assert store.add_op_measurements([]) == 0
    frame = store.op_measurements()
    assert frame.empty and "latency_ms" in frame.columns
    assert store.op_measurement_counts() == []


def test_records_refuse_bad_values():
    with pytest.raises(ValueError):
        _bmm(0, latency_ms=0.0)
    with pytest.raises(ValueError):
        _bmm(0, latency_ms=float("nan"))
    with pytest.raises(ValueError):
        OpMeasurement(source="neusight", source_file="f", source_row=0, device="t4", op_class="matmul",
                      op_name="mm", dtype="fp32", phase="forward", latency_ms=1.0)
    assert _bmm(1).gemm_flops() == 2 * 2 * 64 * 32 * 2**33 and _allreduce(0).gemm_flops() is None


def test_parquet_exports_leave_measurements_out(store, tmp_path, factory):
    store.add(factory.profile(n_ops=3))
    store.add_op_measurements([_bmm(0)])
    counts = store.export_parquet(tmp_path / "export")
    assert counts == {"profiles": 1, "op_records": 3, "onnx_nodes": 0, "graphs": 0}
    with ProfileStore(f"sqlite:///{tmp_path / 'other.db'}") as other:
        assert other.import_parquet(tmp_path / "export") == 1 and other.count_op_measurements() == 0

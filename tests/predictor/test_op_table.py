"""NeuSight-schema op tables -> the per-op regressor's rows (perfmodel.predictor.op_table)."""

from __future__ import annotations

import pandas as pd
import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.hardware.catalog import load_catalog
from perfmodel.lowering.ops import NEUSIGHT_OP_CLASS, OP_CLASSES, SHAPE_COLUMNS
from perfmodel.predictor.op_table import OP_COLUMNS, ops_from_neusight_frame, read_op_table
from perfmodel.settings import get_settings

NEUSIGHT = get_settings().datasets_dir / "neusight"

# what every NeuSight op name must become (written out, not derived from the table under test)
EXPECTED_CLASS = {"bmm": "bmm", "linear": "linear", "conv": "conv2d", "softmax": "softmax", "ln": "layernorm",
                  **{op: "elementwise" for op in ("add", "addu", "mul", "mulu", "div", "divu", "pow", "powu", "relu",
                                                  "gelu", "tanh")}}


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def neusight_row(op: str, device: str = "Tesla T4") -> dict:
    """One row with the columns NeuSight gives `op` (GEMM: B M N K; conv: B + conv columns; others: B H)."""
    row: dict = {"OPName": op, "Latency": 0.5, "Device": device}
    if op in ("bmm", "linear"):
        row.update(B=3, M=64, N=128, K=256)
    elif op == "conv":
        row.update(B=8, Input_Channel=16, Output_Channel=32, Kernel_Szie=3, Input_Size=28, Stride=1, Padding=1)
    else:
        row.update(B=512, H=1024)
    return row


def test_every_neusight_op_name_maps_to_its_class_with_its_shape(catalog):
    assert set(NEUSIGHT_OP_CLASS) == set(EXPECTED_CLASS)
    frame = pd.DataFrame([neusight_row(op) for op in EXPECTED_CLASS])
    ops = ops_from_neusight_frame(frame, catalog)
    assert list(ops.columns) == list(OP_COLUMNS) and ops.index.equals(frame.index)
    assert ops["op_class"].tolist() == list(EXPECTED_CLASS.values())
    assert ops["op_name"].tolist() == list(EXPECTED_CLASS)
    assert set(ops["op_class"]) == set(OP_CLASSES)
    assert (ops["dtype"] == "fp32").all() and (ops["device"] == "t4").all()
    by_op = ops.set_index("op_name")
    for op in ("bmm", "linear"):
        assert by_op.loc[op, ["batch", "m", "n", "k", "hidden"]].tolist() == [3, 64, 128, 256, 0]
    conv = by_op.loc["conv"]
    assert [conv[c] for c in ("batch", "in_channels", "out_channels", "kernel_size", "input_size", "stride",
                              "padding", "m")] == [8, 16, 32, 3, 28, 1, 1, 0]
    for op in ("add", "relu", "softmax", "ln"):
        assert by_op.loc[op, ["batch", "hidden", "m", "in_channels"]].tolist() == [512, 1024, 0, 0]
    for column in SHAPE_COLUMNS:
        assert ops[column].dtype == "int64"


def test_devices_resolve_through_aliases_and_dtype_column_and_latency(catalog):
    frame = pd.DataFrame([neusight_row("bmm", "NVIDIA A100-PCIE-40GB"), neusight_row("add", "v100-pcie-32gb"),
                          neusight_row("ln", "AMD Instinct MI210")]).assign(dtype=["float16", "bf16", "FP32"])
    frame.index = [10, 20, 30]
    ops = ops_from_neusight_frame(frame, catalog, with_latency=True)
    assert ops["device"].tolist() == ["a100-pcie-40gb", "v100-pcie-32gb", "mi210"]
    assert ops["dtype"].tolist() == ["fp16", "bf16", "fp32"]
    assert ops["latency_ms"].tolist() == [0.5, 0.5, 0.5] and ops.index.tolist() == [10, 20, 30]


def test_column_names_are_case_blind_and_kernel_size_may_be_spelled_right(catalog):
    row = neusight_row("conv")
    row["Kernel_Size"] = row.pop("Kernel_Szie")
    frame = pd.DataFrame([row]).rename(columns=str.lower)
    assert ops_from_neusight_frame(frame, catalog)["kernel_size"].tolist() == [3]


@pytest.mark.parametrize("change,fragments", [
    (lambda f: f.assign(OPName=["bmm", "bmn", "add"]), ["row 2", "'OPName'", "unknown NeuSight op 'bmn'", "bmm"]),
    (lambda f: f.assign(Device=["Tesla T4", "Tesla T4", "Tesla T5"]),
     ["row 3", "'Device'", "unknown accelerator 'Tesla T5'", "did you mean", "Tesla T4"]),
    (lambda f: f.assign(Device=["Tesla T4", "", "Tesla T4"]), ["row 2", "'Device'", "no device"]),
    (lambda f: f.drop(columns=["K"]), ["row 1", "'K'", "op 'bmm' needs column 'K'"]),
    (lambda f: f.drop(columns=["H"]), ["row 3", "'H'", "op 'add' needs column 'H'"]),
    (lambda f: f.assign(M=[64, None, 64]), ["row 2", "'M'", "needs a number"]),
    (lambda f: f.assign(N=[1.5, 128, None]), ["row 1", "'N'", "whole number"]),
    (lambda f: f.assign(B=[3, 3, 0]), ["row 3", "'B'", "whole number ≥ 1"]),
    (lambda f: f.assign(dtype=["fp32", "int8", "fp32"]), ["row 2", "'dtype'", "unknown dtype 'int8'"]),
    (lambda f: f.drop(columns=["Device"]), ["no 'Device' column"]),
])
def test_bad_rows_name_the_row_and_the_column(catalog, change, fragments):
    good = pd.DataFrame([neusight_row("bmm"), neusight_row("linear"), neusight_row("add")])
    ops_from_neusight_frame(good, catalog)
    with pytest.raises(PerfmodelError) as info:
        ops_from_neusight_frame(change(good), catalog)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_a_conv_without_stride_is_named(catalog):
    frame = pd.DataFrame([neusight_row("add"), neusight_row("conv")]).drop(columns=["Stride"])
    with pytest.raises(PerfmodelError, match=r"row 2, column 'Stride': op 'conv' needs column 'Stride'"):
        ops_from_neusight_frame(frame, catalog)


def test_with_latency_needs_positive_latencies(catalog):
    frame = pd.DataFrame([neusight_row("add"), neusight_row("add")]).assign(Latency=[0.1, -1])
    with pytest.raises(PerfmodelError, match="row 2, column 'Latency'"):
        ops_from_neusight_frame(frame, catalog, with_latency=True)


def test_read_op_table_keeps_cells_as_written(tmp_path):
    path = tmp_path / "ops.csv"
    path.write_text("OPName,Latency,Device,B,H,note\nadd,0.035466667264699936,Tesla T4,007,1024,\n")
    frame = read_op_table(path)
    assert frame.loc[0, "Latency"] == "0.035466667264699936" and frame.loc[0, "B"] == "007"
    assert frame.loc[0, "note"] == ""
    with pytest.raises(PerfmodelError, match="no such file"):
        read_op_table(tmp_path / "missing.csv")
    (tmp_path / "empty.csv").write_text("OPName,Device,B,H\n")
    with pytest.raises(PerfmodelError, match="no data rows"):
        read_op_table(tmp_path / "empty.csv")


def test_neusight_files_map_whole(catalog):
    if not NEUSIGHT.is_dir():
        pytest.skip(f"NeuSight dataset not found at {NEUSIGHT} (set PERFMODEL_DATASETS_DIR, or put shared/datasets "
                    "beside the checkout)")
    files = [NEUSIGHT / "data/dataset/test/linear.csv.gz", NEUSIGHT / "data/dataset/test/elem.csv.gz",
             NEUSIGHT / "data/dataset/train/collect/conv/p2.1.0/Tesla T4.csv.gz"]
    for path in files:
        frame = read_op_table(path)
        ops = ops_from_neusight_frame(frame, catalog, with_latency=True)
        assert len(ops) == len(frame) and (ops["latency_ms"] > 0).all()
        gemm = ops["op_class"].isin(["bmm", "linear", "conv2d"])
        assert (ops.loc[gemm, "batch"] >= 1).all() and (ops.loc[~gemm, "hidden"] >= 1).all()

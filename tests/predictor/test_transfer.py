"""Measured-profile transfer (perfmodel.predictor.transfer) and its evaluation on NeuSight's per-op label tables
(perfmodel.evaluation.transfer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.evaluation.transfer import (
    FX_RULES,
    MAPPED,
    NO_KERNEL,
    UNMAPPED,
    coverage,
    evaluate_transfer,
    fx_target,
    label_table_ops,
    neusight_sweep_ops,
    scan_label_tables,
)
from perfmodel.hardware.catalog import load_catalog
from perfmodel.predictor.transfer import transfer_ops
from perfmodel.regressors.device_ops import DeviceOpRegressor
from perfmodel.settings import get_settings

NEUSIGHT = get_settings().datasets_dir / "neusight"


def neusight() -> Path:
    if not NEUSIGHT.is_dir():
        pytest.skip(f"NeuSight dataset not found at {NEUSIGHT} (set PERFMODEL_DATASETS_DIR, or put shared/datasets "
                    "beside the checkout)")
    return NEUSIGHT


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.fixture(scope="module")
def regressor(catalog):
    """A tiny per-op model: 40 rows of every NeuSight sweep file (~4k rows), 30 rounds."""
    ops = neusight_sweep_ops(neusight(), catalog, max_rows_per_file=40)
    assert 3000 < len(ops) < 6000 and ops["device"].nunique() >= 6
    return DeviceOpRegressor(n_estimators=30, nthread=1).fit(ops, catalog)


def measured_profile() -> pd.DataFrame:
    """A few ops of every class the regressor knows, measured on a T4 (times made up)."""
    rows = [
        {"op_class": "linear", "op_name": "linear", "batch": 1, "m": 4096, "n": 1024, "k": 1024},
        {"op_class": "bmm", "op_name": "bmm", "batch": 64, "m": 512, "n": 512, "k": 64},
        {"op_class": "conv2d", "op_name": "conv", "batch": 8, "in_channels": 64, "out_channels": 64,
         "kernel_size": 3, "input_size": 56, "stride": 1, "padding": 1},
        {"op_class": "elementwise", "op_name": "add", "batch": 4096, "hidden": 1024},
        {"op_class": "softmax", "op_name": "softmax", "batch": 8192, "hidden": 512},
        {"op_class": "layernorm", "op_name": "ln", "batch": 4096, "hidden": 1024},
    ]
    frame = pd.DataFrame(rows).fillna(0)
    for column in ("batch", "m", "n", "k", "hidden", "in_channels", "out_channels", "kernel_size", "input_size",
                   "stride", "padding"):
        frame[column] = frame[column].astype(np.int64)
    return frame.assign(dtype="fp32", device="t4", latency_ms=[2.5, 0.9, 1.7, 0.12, 0.3, 0.11])


def test_transfer_to_the_same_device_returns_the_measured_times(regressor, catalog):
    measured = measured_profile()
    moved = transfer_ops(measured, "Tesla T4", regressor, catalog)
    assert moved.index.equals(measured.index)
    assert (moved["target_device"] == "t4").all() and (moved["ratio"] == 1.0).all()
    assert moved["transferred_ms"].tolist() == measured["latency_ms"].tolist()


def test_transfer_ratio_is_the_regressors_ratio(regressor, catalog):
    measured = measured_profile().assign(device="Tesla T4")  # an alias is resolved
    moved = transfer_ops(measured, "NVIDIA A100-PCIE-40GB", regressor, catalog)
    on_t4 = regressor.predict(measured.assign(device="t4"), catalog).latency_ms
    on_a100 = regressor.predict(measured.assign(device="a100-pcie-40gb"), catalog).latency_ms
    np.testing.assert_allclose(moved["ratio"], on_a100 / on_t4, rtol=1e-12)
    np.testing.assert_allclose(moved["transferred_ms"], measured["latency_ms"] * on_a100 / on_t4, rtol=1e-12)
    np.testing.assert_allclose(moved["target_predicted_ms"], on_a100, rtol=1e-12)
    assert (moved["device"] == "t4").all() and (moved["target_device"] == "a100-pcie-40gb").all()
    assert moved["transferred_ms"].sum() < measured["latency_ms"].sum()  # an A100 is faster than a T4
    assert moved["extrapolated"].dtype == bool


def test_transfer_refuses_bad_input(regressor, catalog):
    measured = measured_profile()
    with pytest.raises(PerfmodelError, match="did you mean"):
        transfer_ops(measured, "Tesla T5", regressor, catalog)
    with pytest.raises(PerfmodelError, match="latency_ms"):
        transfer_ops(measured.drop(columns=["latency_ms"]), "t4", regressor, catalog)
    with pytest.raises(PerfmodelError, match="row 2: latency_ms"):
        transfer_ops(measured.assign(latency_ms=[1, -1, 1, 1, 1, 1]), "t4", regressor, catalog)
    with pytest.raises(PerfmodelError, match="unknown accelerator 'Tesla T9'"):
        transfer_ops(measured.assign(device="Tesla T9"), "t4", regressor, catalog)
    assert transfer_ops(measured.iloc[:0], "t4", regressor, catalog).empty


# --- NeuSight's fx node tables ------------------------------------------------------------------------------------


def fx_row(op, target, input_shapes, output_shape, dtype="torch.float32", fw=1.0, name=None, args="(x,)",
           contiguous=None, meta=""):
    return {"op": op, "target": target, "_args": args, "meta": meta, "input_shapes": str(input_shapes),
            "input_contiguous": str(contiguous or [True] * len(input_shapes)), "output_shape": str(output_shape),
            "dtype": dtype, "fw_latency": fw, "bw_latency": 0.0, "Name": name or str(target)}


def module(cls):
    return f"{{'nn_module_stack': OrderedDict([('m', <class 'torch.nn.modules.x.{cls}'>)])}}"


FN = "<built-in function {}>"
METHOD = "<built-in method {} of type object at 0x7f85fb894d60>"


def test_fx_nodes_map_to_rows_or_say_why_not():
    rows = [
        fx_row("placeholder", "input_ids", [], (4, 16), dtype="torch.int64", fw=0.0, name="input_ids"),
        fx_row("call_module", "lm_head", [[4, 16, 64]], (4, 16, 1000), meta=module("Linear"), name="lin"),
        fx_row("call_function", METHOD.format("addmm"), [[96], [64, 32], [32, 96]], (64, 96), name="addmm"),
        fx_row("call_function", METHOD.format("matmul"), [[4, 2, 16, 8], [4, 2, 8, 16]], (4, 2, 16, 16),
               name="scores"),
        fx_row("call_function", METHOD.format("matmul"), [[4, 16, 64], [64, 10]], (4, 16, 10), name="mm2d"),
        fx_row("call_function", METHOD.format("bmm"), [[8, 16, 8], [8, 8, 16]], (8, 16, 16), name="bmm"),
        fx_row("call_function", "<function softmax at 0x1554c57f9a20>", [[4, 2, 16, 16]], (4, 2, 16, 16),
               name="softmax"),
        fx_row("call_module", "ln", [[4, 16, 64]], (4, 16, 64), meta=module("LayerNorm"), name="ln"),
        fx_row("call_function", FN.format("add"), [[4, 16, 64], [4, 16, 64]], (4, 16, 64), name="residual"),
        fx_row("call_function", FN.format("add"), [[4, 2, 16, 16], [4, 1, 1, 16]], (4, 2, 16, 16), name="mask"),
        fx_row("call_function", FN.format("truediv"), [[4, 2, 16, 16]], (4, 2, 16, 16), name="scale"),
        fx_row("call_function", FN.format("gelu"), [[4, 16, 64]], (4, 16, 64), name="gelu"),
        fx_row("call_module", "drop", [[4, 16, 64]], (4, 16, 64), meta=module("Dropout"), fw=0.01, name="drop"),
        fx_row("call_module", "wte", [[4, 16]], (4, 16, 64), meta=module("Embedding"), name="wte"),
        fx_row("call_method", "contiguous", [[4, 16, 2, 32]], (4, 16, 2, 32), contiguous=[False], name="copy"),
        fx_row("call_method", "contiguous", [[4, 16, 2, 32]], (4, 16, 2, 32), fw=0.01, name="nocopy"),
        fx_row("call_method", "to", [[4, 16, 64], [1]], (4, 16, 64), args="(residual, torch.float32)", fw=0.01,
               name="same_dtype"),
        fx_row("call_method", "to", [[4, 16, 64], [1]], (4, 16, 64), dtype="torch.bool",
               args="(residual, torch.bool)", name="to_bool"),
        fx_row("call_method", "view", [[4, 16, 64], [1]], (64, 64), fw=0.01, name="view"),
        fx_row("call_method", "size", [[4, 16, 64]], (1,), dtype=float("nan"), fw=0.01, name="size"),
        fx_row("call_function", FN.format("add"), [[1]], (1,), dtype=float("nan"), fw=0.01, name="int_add"),
        fx_row("call_function", METHOD.format("tensor"), [[1], [1]], (1,), fw=0.03, name="h2d"),
    ]
    nodes = label_table_ops(pd.DataFrame(rows), "inference").set_index("name")
    status = nodes["status"].to_dict()
    assert {n for n, s in status.items() if s == UNMAPPED} == {"h2d"}
    assert {n for n, s in status.items() if s == NO_KERNEL} == {"input_ids", "drop", "nocopy", "same_dtype", "view",
                                                                  "size", "int_add"}

    def shape(name, *columns):
        return [int(nodes.loc[name, c]) for c in columns]

    assert nodes.loc["lin", "op_class"] == "linear" and shape("lin", "batch", "m", "n", "k") == [1, 64, 1000, 64]
    assert nodes.loc["addmm", "op_class"] == "linear" and shape("addmm", "m", "n", "k") == [64, 96, 32]
    assert nodes.loc["scores", "op_class"] == "bmm" and shape("scores", "batch", "m", "n", "k") == [8, 16, 16, 8]
    assert nodes.loc["mm2d", "op_class"] == "linear" and shape("mm2d", "m", "n", "k") == [64, 10, 64]
    assert nodes.loc["bmm", "op_class"] == "bmm" and shape("bmm", "batch", "m", "n", "k") == [8, 16, 16, 8]
    assert nodes.loc["softmax", "op_class"] == "softmax" and shape("softmax", "batch", "hidden") == [128, 16]
    assert nodes.loc["ln", "op_name"] == "ln" and shape("ln", "batch", "hidden") == [64, 64]
    names = nodes["op_name"].to_dict()
    assert (names["residual"], names["mask"], names["scale"], names["gelu"]) == ("add", "addu", "divu", "gelu")
    assert names["wte"] == "addu" and names["copy"] == "addu" and names["to_bool"] == "addu"
    assert nodes.loc["lin", "dtype"] == "fp32" and nodes.loc["to_bool", "dtype"] == "fp32"

    training = label_table_ops(pd.DataFrame(rows), "train").set_index("name")
    assert training.loc["drop", "status"] == MAPPED and training.loc["drop", "op_name"] == "mul"
    share = coverage(nodes)
    assert share["unmapped_ms"] == pytest.approx(0.03) and 0.9 < share["mapped_share"] < 1


def test_fx_target_names():
    assert fx_target("call_function", METHOD.format("addmm"), "") == "addmm"
    assert fx_target("call_function", "<function softmax at 0x1>", "") == "softmax"
    assert fx_target("call_function", "<class 'torch.finfo'>", "") == "torch.finfo"
    assert fx_target("call_method", "masked_fill", "") == "masked_fill"
    assert fx_target("call_module", "bert.pooler.activation", module("Tanh")) == "module:Tanh"
    assert all(key in FX_RULES for key in ("module:Linear", "addmm", "matmul", "bmm", "softmax", "module:LayerNorm",
                                           "gelu", "add", "mul"))


def test_evaluate_transfer_on_neusight_tables(regressor, catalog):
    tables, _ = scan_label_tables(neusight(), catalog)
    chosen = [t for t in tables if t.key == ("bert_large", "train", 512, 2)]
    assert len(chosen) >= 2
    used = []

    def for_target(device):
        used.append(device)
        return regressor

    result = evaluate_transfer(chosen, for_target, catalog)
    pairs = result.pairs
    assert len(pairs) == len(chosen) * (len(chosen) - 1) and sorted(set(used)) == sorted(t.device for t in chosen)
    assert (pairs["rows"] > 20).all() and (pairs["mapped_share"] > 0.9).all()
    assert (pairs["measured_ms"] > 0).all() and np.isfinite(pairs["ape_transfer"]).all()
    assert set(result.classes["op_class"]) == {"bmm", "elementwise", "layernorm", "linear", "softmax"}
    assert (result.coverage["mapped_share"] > 0.9).all()
    # per class sums add up to the pair's
    by_pair = result.classes.groupby(["source", "target"])["transferred_ms"].sum()
    for _, pair in pairs.iterrows():
        assert by_pair[(pair["source"], pair["target"])] == pytest.approx(pair["transferred_ms"])


def test_sweep_rows_leave_the_excluded_device_out(catalog):
    ops = neusight_sweep_ops(neusight(), catalog, exclude_devices=["t4"], op_classes=["softmax"],
                             max_rows_per_file=10)
    assert set(ops["op_class"]) == {"softmax"} and "t4" not in set(ops["device"]) and (ops["latency_ms"] > 0).all()

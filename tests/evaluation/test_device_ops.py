from typing import ClassVar

import numpy as np
import pandas as pd
import pytest

from perfmodel.evaluation.device_ops import error_table, leave_one_device_out, op_class_mape, training_rows
from perfmodel.features.device_ops import device_op_features
from perfmodel.hardware.catalog import load_catalog
from perfmodel.regressors.device_ops import DeviceOpRegressor, base_ms


class Recording(DeviceOpRegressor):
    trained_on: ClassVar[list[set[str]]] = []

    def fit(self, ops, catalog):
        Recording.trained_on.append(set(ops["device"]))
        return super().fit(ops, catalog)


@pytest.fixture(scope="module")
def ops():
    catalog = load_catalog()
    rng = np.random.default_rng(0)
    frames = [pd.DataFrame({"op_class": "linear", "op_name": "linear", "dtype": "fp32", "device": device,
                            "phase": "forward", "batch": 1, "m": rng.integers(8, 4096, 150),
                            "n": rng.integers(8, 4096, 150), "k": rng.integers(8, 4096, 150)})
              for device in ("t4", "v100-pcie-32gb", "a100-pcie-40gb")]
    out = pd.concat(frames, ignore_index=True)
    return out.assign(latency_ms=2.0 * base_ms(device_op_features(out, catalog)) + 0.01)


def test_every_device_is_held_out_once_and_never_trained_on(ops):
    Recording.trained_on = []
    predictions = leave_one_device_out(ops, load_catalog(), lambda: Recording(n_estimators=20))
    assert len(predictions) == len(ops)
    # held out in sorted order: a100, t4, v100
    assert Recording.trained_on == [{"t4", "v100-pcie-32gb"}, {"a100-pcie-40gb", "v100-pcie-32gb"},
                                    {"a100-pcie-40gb", "t4"}]
    table = error_table(predictions)
    assert set(table.index.get_level_values("device")) == {"t4", "v100-pcie-32gb", "a100-pcie-40gb"}
    assert (table["mape_pct"] >= 0).all() and table["coverage"].between(0, 1).all()
    assert op_class_mape(predictions).index.tolist() == ["linear"]


def test_a_convolution_row_whose_work_the_schema_cannot_state_is_not_a_training_row():
    """DeepBench's non-square speech convolutions (161 x 700 inputs, 5 x 20 kernels) come without `input_size` and
    `kernel_size`: their FLOPs would be counted as a 1 x 1 image's, so they are left out; other classes need none."""
    raw = pd.DataFrame({"op_class": ["conv2d", "conv2d", "bmm"], "phase": "forward", "latency_ms": [1.0, 2.0, 3.0],
                        "input_size": [56, None, None], "kernel_size": [3, None, None], "stride": [1, 2, None],
                        "input_height": [56, 161, None], "input_width": [56, 700, None]})
    rows = training_rows(raw)
    assert rows["latency_ms"].tolist() == [1.0, 3.0]


def test_training_rows_keep_forward_ops_and_alias_plain_gemms():
    raw = pd.DataFrame({"op_class": ["gemm", "conv2d", "conv2d"], "phase": ["forward", "forward", "backward_data"],
                        "latency_ms": [1.0, 2.0, 3.0], "input_size": 56, "kernel_size": 3, "stride": 1})
    rows = training_rows(raw)
    assert rows["op_class"].tolist() == ["bmm", "conv2d"]

"""What a composed step says besides its cost: the share of the device's compute units its kernels hold
(`kernel_sm_fill`, the co-location model's input under MPS), and the shares of its convolution time in maths no
kernel measurement covers (`conv_math_masks`), from kernel shapes and real captured graphs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfmodel.graph import graph_for_job
from perfmodel.hardware.catalog import get_accelerator
from perfmodel.jobs.spec import JobSpec
from perfmodel.lowering.ops import GEMM_CLASSES, op_work
from perfmodel.predictor.composition import RESIDENT_THREADS_PER_CU, kernel_sm_fill, step_sm_fill
from perfmodel.predictor.gpu_iteration import DevicePredictor

RNG = np.random.default_rng(5)


def _fill(rows: list[dict], units: float) -> np.ndarray:
    frame = pd.DataFrame(rows).fillna(0)
    frame["dtype"] = frame.get("dtype", "fp32")
    return kernel_sm_fill(op_work(frame), frame["op_class"].isin(GEMM_CLASSES).to_numpy(), units)


def test_a_kernel_holds_the_units_its_tiles_or_threads_need_and_at_least_one():
    units = 108.0  # an A100's SMs
    big, lstm_step, conv, tiny, wide = _fill([
        {"op_class": "linear", "batch": 1, "m": 4096, "n": 4096, "k": 4096},  # 32 x 32 tiles of 128: every SM
        {"op_class": "linear", "batch": 1, "m": 5, "n": 800, "k": 200},  # one recurrent step at batch 5: 7 tiles
        {"op_class": "conv2d", "batch": 64, "in_channels": 64, "out_channels": 64, "kernel_size": 3,
         "input_size": 56, "stride": 1, "padding": 1},
        {"op_class": "elementwise", "op_name": "add", "batch": 4, "hidden": 1000},  # 4,000 elements
        {"op_class": "elementwise", "op_name": "add", "batch": 4096, "hidden": 4096},
    ], units)
    assert big == 1.0 and conv == 1.0 and wide == 1.0
    assert lstm_step == pytest.approx(7 / units)
    assert tiny == pytest.approx(1 / units)  # 1,000 threads: less than one SM's 2,048, and a kernel holds one
    half = _fill([{"op_class": "elementwise", "op_name": "relu", "batch": 1,
                   "hidden": int(units * RESIDENT_THREADS_PER_CU * 4 / 2)}], units)
    assert half == pytest.approx(0.5)


def test_random_kernels_hold_between_one_unit_and_the_device_and_more_work_never_holds_less():
    rows = []
    for _ in range(300):
        op_class = RNG.choice(["linear", "bmm", "elementwise", "softmax", "layernorm"])
        rows.append({"op_class": op_class, "op_name": "add", "batch": int(RNG.integers(1, 512)),
                     "m": int(RNG.integers(1, 8192)), "n": int(RNG.integers(1, 8192)), "k": int(RNG.integers(1, 8192)),
                     "hidden": int(RNG.integers(1, 65536)), "dtype": RNG.choice(["fp32", "fp16"])})
    for units in (40.0, 108.0, 132.0, 304.0):
        fill = _fill(rows, units)
        assert np.all(fill >= 1 / units - 1e-12) and np.all(fill <= 1.0)
        doubled = _fill([{**row, "batch": 2 * row["batch"]} for row in rows], units)
        assert np.all(doubled >= fill - 1e-12)
        assert np.all(_fill(rows, units * 2) <= fill + 1e-12)  # the same kernels on a device with more units


def test_a_steps_fill_is_its_kernels_weighted_by_their_time():
    ms = np.array([[1.0, 3.0], [0.0, 0.0]])
    fill = np.array([[1.0, 0.2], [0.5, 0.5]])
    assert step_sm_fill(ms, fill) == pytest.approx([(1.0 + 0.6) / 4.0, 1.0])


@pytest.fixture(scope="module")
def device() -> DevicePredictor:
    return DevicePredictor.load()


def test_a_recurrent_step_at_a_small_batch_holds_little_of_a_big_gpu_and_a_resnet_at_a_large_one_all_of_it(device):
    fills = {}
    for name, batch, precision in (("gavel-lm", 5, "fp32"), ("resnet50", 256, "amp"), ("resnet50", 8, "amp")):
        spec = JobSpec.from_options(zoo=name, batch_size=batch, precision=precision)
        graph = graph_for_job(spec)  # captured once, priced on both GPUs
        for accelerator in ("a100-sxm4-80gb", "t4"):
            _, features = device.predict_composed(spec, accelerator, graph=graph)
            fills[(name, batch, accelerator)] = features["sm_fill"]
            assert 1 / get_accelerator(accelerator).compute_units <= features["sm_fill"] <= 1.0
    assert fills[("gavel-lm", 5, "a100-sxm4-80gb")] < 0.3
    assert fills[("resnet50", 256, "a100-sxm4-80gb")] > 0.9
    assert fills[("resnet50", 8, "a100-sxm4-80gb")] < fills[("resnet50", 256, "a100-sxm4-80gb")]
    for key in (("gavel-lm", 5), ("resnet50", 8)):  # the T4's 40 SMs fill before the A100's 108
        assert fills[(*key, "t4")] > fills[(*key, "a100-sxm4-80gb")]


def test_winograd_shaped_convolutions_are_the_3x3_stride_1_ungrouped_2d_ones():
    import torch
    from torch import nn

    from perfmodel.graph.from_torch import graph_from_module
    from perfmodel.lowering.rows import conv_spatial_dims, winograd_shaped

    convs = nn.ModuleList([nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 3, stride=2, padding=1),
                           nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 3, padding=2, dilation=2),
                           nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 8, (3, 3), padding=1)])

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs, self.audio = convs, nn.Conv1d(8, 8, 3, padding=1)

        def forward(self, x):
            out = sum(conv(x).mean() for conv in self.convs)
            return out + self.audio(x.flatten(2)).mean()

    graph = graph_from_module(Net(), (torch.randn(2, 8, 12, 10),), name="convs")
    nodes = [node for node in graph.nodes if node.kind.value == "conv"]
    assert [winograd_shaped(node) for node in nodes] == [True, False, False, False, False, True, False]
    assert [conv_spatial_dims(node) for node in nodes] == [2] * 6 + [1]


@pytest.mark.parametrize("precision, accelerator, tf32, winograd", [
    ("fp32", "a100-sxm4-80gb", True, False),  # PyTorch's defaults on Ampere: TF32 convolutions
    ("fp32-strict", "a100-sxm4-80gb", False, True),
    ("fp32", "v100-sxm2-16gb", False, True),  # no TF32 before Ampere
    ("amp", "a100-sxm4-80gb", False, False),
    ("amp", "v100-sxm2-16gb", False, False)])
def test_a_resnets_convolution_time_is_tf32_winograd_or_neither_by_precision_and_gpu(device, precision, accelerator,
                                                                                      tf32, winograd):
    spec = JobSpec.from_options(zoo="resnet18", batch_size=8, precision=precision)
    _, features = device.predict_composed(spec, accelerator)
    assert 0.0 <= features["share_conv_tf32"] + features["share_conv_winograd"] <= features["share_conv"] + 1e-9
    assert (features["share_conv_tf32"] > 0.1) == tf32
    assert (features["share_conv_winograd"] > 0.05) == winograd

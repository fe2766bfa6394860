"""perfmodel predict on a GPU: the per-op device model over a real (tiny) HF model's graph."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from perfmodel.cli.main import app
from perfmodel.features.device_ops import device_op_features
from perfmodel.hardware.catalog import load_catalog
from perfmodel.jobs.spec import JobSpec
from perfmodel.predictor import DevicePredictor
from perfmodel.registry.registry import ModelRegistry
from perfmodel.regressors.device_ops import DeviceOpRegressor, base_ms

TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 1000, "n_positions": 64}
DEVICES = ("t4", "v100-pcie-32gb", "a100-pcie-40gb", "p100-pcie-16gb")


def _synthetic(catalog, n=150, seed=0):
    rng = np.random.default_rng(seed)
    frames = []
    for device in DEVICES:
        for op_class in ("bmm", "linear"):
            size = rng.integers(1, 2048, size=(n, 3))
            frames.append(pd.DataFrame({"op_class": op_class, "op_name": op_class, "dtype": "fp32",
                                        "device": device, "batch": rng.integers(1, 64, n), "m": size[:, 0],
                                        "n": size[:, 1], "k": size[:, 2]}))
        for op_class, name in (("elementwise", "add"), ("softmax", "softmax"), ("layernorm", "ln")):
            frames.append(pd.DataFrame({"op_class": op_class, "op_name": name, "dtype": "fp32", "device": device,
                                        "batch": rng.integers(1, 8192, n), "hidden": rng.integers(1, 8192, n)}))
    ops = pd.concat(frames, ignore_index=True)
    return ops.assign(latency_ms=1.5 * base_ms(device_op_features(ops, catalog)) + 0.006)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    catalog = load_catalog()
    root = tmp_path_factory.mktemp("models")
    registry = ModelRegistry(root)
    entry = registry.save(DeviceOpRegressor(n_estimators=40).fit(_synthetic(catalog), catalog), "xgb-device-ops",
                          {"devices": list(DEVICES)})
    registry.promote(entry.ref)  # role from the regressor kind: device-ops
    assert registry.promoted_ref("device-ops") == entry.ref and registry.promoted_ref() is None
    return root


def test_breakdown_is_an_explicit_sum_and_a_faster_gpu_is_faster(models_dir):
    predictor = DevicePredictor.load(models_dir=models_dir)
    spec = JobSpec.from_options(hf_config=TINY_GPT2, batch_size=4, seq_len=32, optimizer="adam")
    t4, h100 = predictor.predict(spec, "Tesla T4"), predictor.predict(spec, "NVIDIA H100 80GB HBM3")
    for result in (t4, h100):
        parts = result.breakdown_ms
        assert parts["forward"] > 0 and parts["backward"] > 0 and parts["optimizer"] > 0
        assert result.iter_time_ms == pytest.approx(sum(parts.values()))
        lo, hi = result.interval_ms
        assert lo <= result.iter_time_ms <= hi
    assert h100.accelerator == "h100-sxm5" and h100.iter_time_ms < t4.iter_time_ms
    assert h100.extrapolated and not t4.extrapolated  # H100 is faster than any training GPU


def test_inference_has_no_backward_or_optimizer(models_dir):
    spec = JobSpec.from_options(hf_config=TINY_GPT2, batch_size=4, seq_len=32, mode="inference")
    result = DevicePredictor.load(models_dir=models_dir).predict(spec, "t4")
    assert result.breakdown_ms["backward"] == 0 and result.breakdown_ms["optimizer"] == 0
    assert result.breakdown_ms["forward"] > 0


def test_cli_predict_on_a_gpu_uses_the_device_model(models_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("PERFMODEL_MODELS_DIR", str(models_dir))
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_GPT2))
    result = CliRunner().invoke(app, ["predict", "--hf-config", str(config), "-b", "2", "--seq-len", "16",
                                      "--accelerator", "NVIDIA A100-PCIE-40GB", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # transformers warns about the tiny config on stderr
    assert data["accelerator"] == "a100-pcie-40gb" and data["model_version"].startswith("xgb-device-ops/")
    assert set(data["breakdown_ms"]) == {"forward", "backward", "optimizer", "communication", "pipeline_bubble",
                                         "overhead"}
    bad = CliRunner().invoke(app, ["predict", "--hf-config", str(config), "--seq-len", "16", "--accelerator", "H1000"])
    assert bad.exit_code == 2 and "H100" in bad.output


def test_many_jobs_composed_in_one_call_equal_one_call_each():
    from perfmodel.graph import graph_for_job
    from perfmodel.jobs.spec import JobSpec
    from perfmodel.placement.spec import Parallelism, PlacementSpec
    from perfmodel.predictor.gpu_iteration import DevicePredictor
    from perfmodel.predictor.placed import PlacementPredictor

    device = DevicePredictor.load()  # the shipped model
    items = []
    # each distinct kernel is priced once: a job twice, and a job with its TF32 twin (the same kernels but the
    # matmuls), answer as alone
    jobs = [("resnet18", "t4", 4, "fp32"), ("bert-small", "a100-sxm4-80gb", 2, "fp32"),
            ("resnet18", "h100-sxm5", 8, "fp32"), ("resnet18", "t4", 4, "fp32"),
            ("bert-small", "a100-sxm4-80gb", 2, "tf32")]
    for name, accelerator, batch, precision in jobs:
        spec = JobSpec.from_options(zoo=name, batch_size=batch, seq_len=32, precision=precision)
        items.append((spec, accelerator, graph_for_job(spec)))
    for (spec, accelerator, graph), (many, features) in zip(items, device.predict_composed_many(items)):
        one, own_features = device.predict_composed(spec, accelerator, graph=graph)
        assert many == one and features == own_features
    # a matrix of new batches prefetches them in one call and answers as one placement at a time does
    spec = JobSpec.from_options(zoo="resnet18", batch_size=4)
    placements = [PlacementSpec(accelerator="t4", devices_per_node=(n,), parallelism=Parallelism(data=n),
                                global_batch_size=b * n) for b in (2, 6) for n in (1, 2)]
    matrix = PlacementPredictor(None, device).matrix_arrays([spec], placements)
    alone = PlacementPredictor(None, device)
    for j, placement in enumerate(placements):
        assert matrix["iter_time_ms"][0, j] == pytest.approx(alone.predict(spec, placement).iter_time_ms, rel=1e-9)


def test_a_training_steps_half_kernel_never_beats_its_fp32_twin_by_more_than_their_rooflines_differ():
    """Sources disagree: here fp32 rows carry a 40 µs floor per op and fp16 rows a 2 µs one, as NeuSight's eager
    fp32 timings and the serving traces' fp16 ones do. In a training step a small fp16 kernel is still priced at least
    its fp32 twin's price times the ratio of their rooflines, raised by at most `HALF_LIFT_MAX_MS`; a large one, and
    every inference row, keep their own."""
    from perfmodel.lowering.ops import op_roofline_ms
    from perfmodel.predictor.gpu_iteration import HALF_LIFT_MAX_MS, priced_with_fp32_twins

    catalog = load_catalog()
    fp32 = _synthetic(catalog)
    fp32["latency_ms"] = 1.5 * base_ms(device_op_features(fp32, catalog)) + 0.040
    fp16 = _synthetic(catalog, seed=1).assign(dtype="fp16")
    fp16["latency_ms"] = 2.0 * base_ms(device_op_features(fp16, catalog)) + 0.002
    model = DeviceOpRegressor(n_estimators=60).fit(pd.concat([fp32, fp16], ignore_index=True), catalog)
    query = _synthetic(catalog, n=60, seed=2).drop(columns="latency_ms")
    rows = pd.concat([query, query.assign(dtype="fp16", math="fp16")], ignore_index=True)
    rows["math"] = rows["math"].fillna("fp32")
    alone = model.predict(rows, catalog)
    training = priced_with_fp32_twins(model, rows, catalog, np.ones(len(rows), dtype=bool))
    n = len(query)
    ratio = op_roofline_ms(rows[n:], catalog) / op_roofline_ms(rows[:n].assign(math="fp32"), catalog)
    floor = np.minimum(training.latency_ms[:n] * ratio, alone.latency_ms[n:] + HALF_LIFT_MAX_MS)
    assert np.all(training.latency_ms[n:] >= floor * (1 - 1e-9))
    assert np.all(training.latency_ms[n:] <= (alone.latency_ms[n:] + HALF_LIFT_MAX_MS) * (1 + 1e-9))
    lifted = training.latency_ms[n:] > alone.latency_ms[n:] * (1 + 1e-9)
    assert lifted.any() and not lifted.all()  # small kernels only
    assert np.allclose(training.latency_ms[:n], alone.latency_ms[:n], rtol=1e-9)  # fp32 rows keep their price
    assert np.all(training.p10_ms <= training.latency_ms) and np.all(training.latency_ms <= training.p90_ms)
    inference = priced_with_fp32_twins(model, rows, catalog, np.zeros(len(rows), dtype=bool))
    assert np.array_equal(inference.latency_ms, alone.latency_ms)


def test_a_large_fp16_gemm_of_a_training_step_keeps_its_own_price_where_fp32_is_fast_next_to_the_tensor_cores():
    """On an RTX 3090 fp32 runs at half the tensor cores' fp16 rate (a quarter on an RTX A6000): the fp32 twin's
    bound held Transformer-XL's large AMP GEMMs to the fp32 model's efficiency. The shipped model's training price of
    such a GEMM is its own price (plus at most `HALF_LIFT_MAX_MS`) and above its roofline; a big one (over 100 GFLOP)
    runs at over half the peak, as cuBLAS's do."""
    from perfmodel.lowering.ops import op_roofline_ms
    from perfmodel.predictor.gpu_iteration import HALF_LIFT_MAX_MS, priced_with_fp32_twins

    predictor = DevicePredictor.load()
    catalog = predictor.catalog
    shapes = [(4608, 2048, 512), (4608, 512, 2048), (4608, 267735, 512), (8192, 8192, 1024)]
    rows = pd.DataFrame([{"op_class": "linear", "op_name": "linear", "kind": "linear", "dtype": "fp16", "math": "fp16",
                          "device": device, "launch": "eager", "phase": "forward", "part": "fwd", "batch": 1,
                          "m": float(m), "n": float(n), "k": float(k), "hidden": 0, "in_channels": 0.0,
                          "out_channels": 0.0, "kernel_size": 0.0, "input_size": 0.0, "stride": 0.0, "padding": 0.0}
                         for device in ("rtx-3090", "rtx-a6000", "rtx-4090") for m, n, k in shapes])
    own = predictor.regressor.predict(rows, catalog).latency_ms
    training = priced_with_fp32_twins(predictor.regressor, rows, catalog, np.ones(len(rows), dtype=bool)).latency_ms
    assert np.all(training <= own + HALF_LIFT_MAX_MS + 1e-12)
    assert np.all(training >= op_roofline_ms(rows, catalog) * (1 - 1e-9))
    peak = rows["device"].map(lambda name: catalog[name].peak_fp16_gflops).to_numpy()
    flops = 2 * rows["m"] * rows["n"] * rows["k"]
    big = (flops > 1e11).to_numpy()
    assert big.sum() == 6 and np.all(flops[big] / (training[big] * 1e6) > 0.5 * peak[big])


def _conv_rows(batch, cin, cout, kernel, size, stride, device, dtype="fp32"):
    n = len(batch)
    return pd.DataFrame({"op_class": "conv2d", "op_name": "conv2d", "kind": "conv", "dtype": dtype, "math": dtype,
                         "device": device, "launch": "eager", "phase": "forward", "part": "fwd", "batch": batch,
                         "m": 0.0, "n": 0.0, "k": 0.0, "hidden": 0, "in_channels": cin, "out_channels": cout,
                         "kernel_size": kernel, "input_size": size, "stride": stride,
                         "padding": [k // 2 for k in kernel]}, index=range(n))


def test_a_convolution_is_never_priced_above_its_im2col_gemm_nor_a_smaller_map_above_a_larger_one():
    """The shipped conv model, outside its sweeps (maps below 5 x 5), priced a 512 -> 512 3 x 3 convolution at batch 64
    on a V100 at 3.5 ms on a 1 x 1 map and 0.6 ms on a 2 x 2 one. Bounded by im2col + its GEMM, no convolution costs
    more than that, none less than its roofline (for the least arithmetic a library may run it with), and a
    CIFAR-sized ResNet's last stages cost less on smaller maps."""
    from perfmodel.features.device_ops import device_op_features
    from perfmodel.lowering.ops import row_architectures
    from perfmodel.predictor.gpu_iteration import conv_gemm_twins, priced
    from perfmodel.regressors.device_ops import roofline_bound_ms

    predictor = DevicePredictor.load()
    catalog = predictor.catalog
    rng = np.random.default_rng(0)
    n = 200
    for device in ("v100-sxm2-16gb", "a100-sxm4-80gb", "k80"):
        rows = _conv_rows(rng.choice([1, 8, 64, 256], n).tolist(), rng.choice([3, 64, 256, 512], n).tolist(),
                          rng.choice([16, 128, 512], n).tolist(), rng.choice([1, 3, 5], n).tolist(),
                          rng.choice([1, 2, 4, 7, 14, 56], n).tolist(), rng.choice([1, 2], n).tolist(), device)
        training = np.ones(n, dtype=bool)
        out = priced(predictor.regressor, rows, catalog, training)
        _, twins, im2col_bytes, conv_bytes = conv_gemm_twins(rows)
        gemm = priced(predictor.regressor, twins.reset_index(drop=True), catalog, training).latency_ms
        bandwidth_bytes_per_ms = catalog[device].memory_bandwidth_gb_s * 1e6
        bound = np.maximum(gemm + im2col_bytes / bandwidth_bytes_per_ms, conv_bytes / bandwidth_bytes_per_ms)
        assert np.all(out.latency_ms <= bound * (1 + 1e-9))
        assert np.all(out.latency_ms >= conv_bytes / bandwidth_bytes_per_ms * (1 - 1e-9))
        # never below the roofline of the least arithmetic a library may run it with (Winograd's on 3 x 3 fp32)
        least = roofline_bound_ms(rows, device_op_features(rows, catalog), row_architectures(rows, catalog))
        assert np.all(out.latency_ms >= np.maximum(least, conv_bytes / bandwidth_bytes_per_ms) * (1 - 1e-9))
        assert np.all(out.p10_ms <= out.latency_ms) and np.all(out.latency_ms <= out.p90_ms)
        small = _conv_rows([64, 64], [512, 512], [512, 512], [3, 3], [1, 2], [1, 1], device)
        one, two = priced(predictor.regressor, small, catalog, np.ones(2, dtype=bool)).latency_ms
        assert one <= two, device


def test_a_depthwise_gradient_measured_on_the_device_is_priced_as_adapted_not_capped_by_its_gemm_twin():
    """oneDNN runs a depthwise convolution's gradients in kernels of its own, never as im2col + GEMM. On a CPU whose
    depthwise weight gradients take 40x the model's price of their shape, an adaptation fitted on rows of that part
    prices them as measured, past their GEMM twin's bound; its dense convolutions stay within theirs, and so do the
    depthwise gradients of an adaptation whose rows name no part (their kernel was never measured as itself)."""
    from perfmodel.predictor.gpu_iteration import conv_gemm_twins, priced
    from perfmodel.regressors.adaptation import AdaptedRegressor, DeviceAdaptation

    predictor = DevicePredictor.load()
    catalog, base = predictor.catalog, predictor.regressor
    rng = np.random.default_rng(0)
    n = 40
    depthwise = _conv_rows((4 * rng.choice([96, 240, 480], n)).tolist(), [1] * n, [1] * n,
                           rng.choice([3, 5], n).tolist(), rng.choice([14, 28, 56], n).tolist(), [1] * n,
                           "cpu").assign(part="dW")
    dense = _conv_rows(rng.choice([2, 4, 8], n).tolist(), rng.choice([32, 64], n).tolist(),
                       rng.choice([64, 128], n).tolist(), [3] * n, rng.choice([14, 28, 56], n).tolist(), [1] * n, "cpu")
    measured = pd.concat([depthwise.assign(latency_ms=base.predict(depthwise, catalog).latency_ms * 40),
                          dense.assign(latency_ms=base.predict(dense, catalog).latency_ms)], ignore_index=True)
    adapted = AdaptedRegressor(base, {"cpu": DeviceAdaptation.fit(base, measured, catalog)}, catalog)
    rows = pd.concat([depthwise, dense], ignore_index=True)
    training = np.ones(len(rows), dtype=bool)
    out = priced(adapted, rows, catalog, training).latency_ms
    _, twins, im2col_bytes, conv_bytes = conv_gemm_twins(rows)
    gemm = priced(adapted, twins.reset_index(drop=True), catalog, training).latency_ms
    bandwidth_bytes_per_ms = catalog["cpu"].memory_bandwidth_gb_s * 1e6
    bound = np.maximum(gemm + im2col_bytes / bandwidth_bytes_per_ms, conv_bytes / bandwidth_bytes_per_ms)
    is_depthwise = np.arange(len(rows)) < n
    np.testing.assert_allclose(out[is_depthwise], adapted.predict(depthwise, catalog).latency_ms)
    assert np.median(out[is_depthwise] / bound[is_depthwise]) > 1  # the cap would have priced them lower
    assert np.all(out[~is_depthwise] <= bound[~is_depthwise] * (1 + 1e-9))
    unmeasured = AdaptedRegressor(base, {"cpu": DeviceAdaptation.fit(base, measured.drop(columns=["part"]), catalog)},
                                  catalog)
    assert not unmeasured.measured_kernels(rows).any()
    capped = priced(unmeasured, rows, catalog, training).latency_ms
    gemm = priced(unmeasured, twins.reset_index(drop=True), catalog, training).latency_ms
    assert np.all(capped <= np.maximum(gemm + im2col_bytes / bandwidth_bytes_per_ms,
                                       conv_bytes / bandwidth_bytes_per_ms) * (1 + 1e-9))


def test_a_strided_1x1_convolution_bounded_by_its_gemm_stays_within_the_bandwidth():
    """A 1 x 1 stride-2 downsampling convolution (ResNet-18's, 64 -> 128 channels on a 56 x 56 map, batch 16) reads
    four times the map its GEMM twin's im2col matrix holds: bounded by that twin alone it was priced 4 % past an A10's
    bandwidth in TF32."""
    from perfmodel.lowering.ops import op_work
    from perfmodel.predictor.gpu_iteration import priced

    predictor = DevicePredictor.load()
    for math in ("tf32", "fp32"):
        rows = _conv_rows([16], [64], [128], [1], [56], [2], "a10").assign(math=math)
        out = priced(predictor.regressor, rows, predictor.catalog, np.ones(1, dtype=bool))
        work = op_work(rows)
        seconds = out.latency_ms / 1e3
        assert np.all((work.bytes_read + work.bytes_written) / seconds <= 600e9 * (1 + 1e-9)), math


@pytest.mark.parametrize(("precision", "accelerator", "transposed"), [
    ("amp", "a100-sxm4-80gb", True), ("amp-bf16", "h100-sxm", True), ("amp", "t4", True),
    ("fp32", "a100-sxm4-80gb", False),  # TF32 convolutions read NCHW directly
    ("amp", "p100-pcie-16gb", False),  # no tensor cores
    ("amp", "mi250", True), ("amp-bf16", "mi300x", True),  # MIOpen's xdlops solvers transpose NCHW too
    ("amp", "mi25", False),  # GCN: packed half vectors, no matrix cores
])
def test_half_convolutions_on_tensor_cores_pay_the_librarys_nchw_transposes(precision, accelerator, transposed,
                                                                           monkeypatch):
    """Each convolution of an NCHW model in a half type on tensor / matrix cores (cuDNN, MIOpen) gets its layout
    transposes: x and y
    around the forward, dy and dx around backward data, x and dy around backward weights, each read and written
    once in that half type; no other convolution, and no other row of the step, changes."""
    from perfmodel.graph import graph_for_job
    from perfmodel.hardware.catalog import get_accelerator
    from perfmodel.lowering.ops import op_work
    from perfmodel.predictor.gpu_iteration import job_rows

    spec = JobSpec.from_options(zoo="resnet18", batch_size=4, precision=precision)
    graph = graph_for_job(spec)
    rows = job_rows(spec, graph, get_accelerator(accelerator))
    moved = rows[rows["part"] == "layout_transpose"]
    convs = [node for node in graph.nodes if node.kind.value == "conv"]
    if not transposed:
        assert moved.empty
        return
    assert len(moved) == 6 * len(convs)
    assert (moved[moved["phase"] == "forward"].shape[0], moved[moved["phase"] == "backward"].shape[0]) == \
        (2 * len(convs), 4 * len(convs))
    half = moved["dtype"].iloc[0]
    assert set(moved["dtype"]) == set(moved["math"]) == {half} and half in ("fp16", "bf16")
    elements = sum(3 * (n.input_tensors[0].numel + n.output_tensors[0].numel) for n in convs)
    work = op_work(moved)
    size = 2  # bytes of a half element
    assert (work.bytes_read + work.bytes_written).sum() == pytest.approx(2 * size * elements, rel=0.01)
    inference = JobSpec.from_options(zoo="resnet18", batch_size=4, precision=precision, mode="inference")
    served = job_rows(inference, graph_for_job(inference), get_accelerator(accelerator))
    assert (served["part"] == "layout_transpose").sum() == 2 * len(convs)  # forward only
    monkeypatch.setattr("perfmodel.predictor.gpu_iteration.LAYOUT_TRANSPOSE_MATHS", frozenset())
    without = job_rows(spec, graph, get_accelerator(accelerator))
    rest = rows[rows["part"] != "layout_transpose"].drop(columns="node_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(rest, without.drop(columns="node_id")[rest.columns], check_dtype=False)


def test_depthwise_convolutions_run_on_the_cuda_cores_and_pay_no_layout_transposes():
    """MobileNetV2 in AMP on tensor cores: every convolution but the depthwise ones (PyTorch's own channels-first
    kernel, not a tensor-core GEMM) gets its six transposes; the depthwise ones are fp32 math in AMP and in `fp32`
    on an A100 (no TF32), their storage the mode's."""
    from perfmodel.graph import graph_for_job
    from perfmodel.hardware.catalog import get_accelerator
    from perfmodel.lowering.rows import depthwise
    from perfmodel.predictor.gpu_iteration import job_rows

    spec = JobSpec.from_options(zoo="mobilenet_v2", batch_size=4, precision="amp")
    graph = graph_for_job(spec)
    rows = job_rows(spec, graph, get_accelerator("v100-sxm2-16gb"))
    moved = rows[rows["part"] == "layout_transpose"]
    convs = [node for node in graph.nodes if node.kind.value == "conv"]
    deep = {node.id for node in convs if depthwise(node)}
    assert len(deep) == 17
    assert len(moved) == 6 * (len(convs) - len(deep))
    assert not set(moved["node_id"]) & deep
    for precision, dtype, math in (("amp", "fp16", "fp16"), ("fp32", "fp32", "tf32")):
        job = JobSpec.from_options(zoo="mobilenet_v2", batch_size=4, precision=precision)
        kernels = job_rows(job, graph, get_accelerator("a100-sxm4-80gb"))
        convs_rows = kernels[kernels["kind"] == "conv"]
        mine = convs_rows["node_id"].isin(deep)
        assert set(convs_rows.loc[mine, "math"]) == {"fp32"} and set(convs_rows.loc[mine, "dtype"]) == {dtype}
        assert set(convs_rows.loc[~mine, "math"]) == {math}


def test_a_channels_last_job_pays_no_layout_transposes_and_is_answered_faster_in_amp_only():
    """The same convolutional job in channels-last memory format: no transposes, every other row the same; in AMP
    on a tensor-core GPU its step is shorter, in TF32 it is the same step."""
    from perfmodel.graph import graph_for_job
    from perfmodel.hardware.catalog import get_accelerator
    from perfmodel.predictor.gpu_iteration import job_rows

    a100 = get_accelerator("a100-sxm4-80gb")
    predictor = DevicePredictor.load()
    for precision, faster in (("amp", True), ("fp32", False)):
        plain = JobSpec.from_options(zoo="resnet18", batch_size=16, precision=precision)
        converted = plain.model_copy(update={"channels_last": True})
        graph = graph_for_job(plain)
        rows_plain, rows_converted = job_rows(plain, graph, a100), job_rows(converted, graph, a100)
        assert (rows_converted["part"] == "layout_transpose").sum() == 0
        kept = rows_plain[rows_plain["part"] != "layout_transpose"].reset_index(drop=True)
        pd.testing.assert_frame_equal(kept, rows_converted.reset_index(drop=True)[kept.columns], check_dtype=False)
        step_plain = predictor.predict(plain, a100.name, graph=graph).iter_time_ms
        step_converted = predictor.predict(converted, a100.name, graph=graph).iter_time_ms
        if faster:
            assert step_converted < step_plain
        else:
            assert step_converted == pytest.approx(step_plain)


@pytest.mark.parametrize(("accelerator", "fused"), [
    ("k80", False),  # Kepler: PyTorch's memory-efficient kernel needs compute capability 5.0
    ("titan-x-maxwell", True), ("p100-pcie-16gb", True), ("v100-sxm2-16gb", True), ("t4", True),
    ("a100-sxm4-80gb", True), ("h100-sxm5", True), ("b200", True),
    ("mi25", False), ("mi100", False),  # no AOTriton build for GCN or CDNA 1
    ("mi250x", True), ("mi300x", True), ("mi355x", True),
    ("cpu", False),
])
def test_attention_runs_fused_where_pytorch_has_a_fused_kernel_for_the_gpu(accelerator, fused):
    from perfmodel.hardware.catalog import get_accelerator
    from perfmodel.predictor.gpu_iteration import fuses_attention

    assert fuses_attention(get_accelerator(accelerator)) is fused


def test_a_sheet_without_an_architecture_runs_fused_attention_if_it_has_tensor_cores():
    from perfmodel.hardware.catalog import get_accelerator
    from perfmodel.predictor.gpu_iteration import fuses_attention

    for name, fused in (("h100-sxm5", True), ("k80", False), ("p100-pcie-16gb", False)):
        assert fuses_attention(get_accelerator(name).model_copy(update={"architecture": None})) is fused


@pytest.mark.parametrize("accelerator", ["t4", "a100-sxm4-80gb", "h100-sxm5", "mi300x", "k80"])
def test_a_fused_attention_is_cheaper_than_its_decomposition_and_never_below_its_compute_roofline(accelerator,
                                                                                                    monkeypatch):
    """A BERT at sequence 512 in AMP: its fused attention kernels cost less than the eager decomposition they replace
    (no scores through memory, one launch), never less than their FLOPs at the peak of their math nor than the
    smallest kernel of their class; every other kernel keeps its price. Where PyTorch has no fused kernel (K80),
    nothing changes."""
    from perfmodel.graph import graph_for_job
    from perfmodel.hardware.catalog import get_accelerator
    from perfmodel.hardware.math import peak_gflops
    from perfmodel.lowering.ops import op_work
    from perfmodel.predictor.gpu_iteration import DevicePredictor, floor_twins, fuses_attention

    device = DevicePredictor.load()
    hardware = get_accelerator(accelerator)
    spec = JobSpec.from_options(hf_config={"model_type": "bert", "hidden_size": 256, "num_hidden_layers": 2,
                                           "num_attention_heads": 4, "intermediate_size": 1024, "vocab_size": 1000,
                                           "max_position_embeddings": 512},
                                batch_size=16, seq_len=512, precision="amp")
    graph = graph_for_job(spec)
    rows, out = device.predict_rows(spec, hardware, graph)
    monkeypatch.setattr("perfmodel.predictor.gpu_iteration.fuses_attention", lambda hw: False)
    eager_rows, eager = device.predict_rows(spec, hardware, graph)
    attention, eager_attention = ((r["kind"] == "attention").to_numpy() for r in (rows, eager_rows))
    if not fuses_attention(hardware):
        assert rows.equals(eager_rows) and np.array_equal(out.latency_ms, eager.latency_ms)
        return
    assert (rows.loc[attention, "launch"] == "fused").all()
    assert out.latency_ms[attention].sum() < eager.latency_ms[eager_attention].sum()
    # every other kernel as before
    assert np.allclose(out.latency_ms[~attention], eager.latency_ms[~eager_attention], rtol=1e-9)
    fused = rows[attention]
    peak = np.array([peak_gflops(hardware, m, True) for m in fused["math"]]) * 1e9
    assert np.all(out.latency_ms[attention] / 1e3 >= op_work(fused).flops / peak * (1 - 1e-9))
    floor = device.regressor.predict(floor_twins(fused), device.catalog).latency_ms
    assert np.all(out.latency_ms[attention] >= floor * (1 - 1e-9))


@pytest.mark.parametrize(("master", "half"), [("fp16-master", "fp16"), ("bf16-master", "bf16")])
def test_a_master_weight_step_runs_the_half_models_kernels_and_steps_fp32_weights(master, half):
    """fp16-master / bf16-master run every kernel of the half model (`fp16` / `bf16`); their optimizer steps fp32
    weights and also copies the gradients to fp32 and the weights back (`MASTER_COPY_PASSES`), or, where the
    gradients accumulate in fp32 (bf16-master), adds each half gradient into its fp32 one and copies the weights
    back (`FP32_GRADIENT_PASSES`)."""
    from perfmodel.graph import graph_for_job
    from perfmodel.hardware.catalog import get_accelerator
    from perfmodel.lowering.ops import op_work
    from perfmodel.predictor.gpu_iteration import (
        FOREACH_TENSOR_PASSES,
        FP32_GRADIENT_PASSES,
        MASTER_COPY_PASSES,
        job_rows,
    )

    a100 = get_accelerator("a100-sxm4-80gb")
    specs = {p: JobSpec.from_options(hf_config=TINY_GPT2, batch_size=4, seq_len=32, optimizer="adamw", precision=p)
             for p in (master, half)}
    rows = {p: job_rows(s, graph_for_job(s), a100) for p, s in specs.items()}
    step = {p: r[r["phase"] == "optimizer"] for p, r in rows.items()}
    rest = {p: r[r["phase"] != "optimizer"].drop(columns="node_id").reset_index(drop=True) for p, r in rows.items()}
    pd.testing.assert_frame_equal(rest[master], rest[half])
    assert set(step[master]["dtype"]) == {"fp32"} and set(step[half]["dtype"]) == {half}
    moved = {p: float((op_work(s).bytes_read + op_work(s).bytes_written).sum()) for p, s in step.items()}
    passes = FOREACH_TENSOR_PASSES["adamw"]
    # the fp32 step moves twice the bytes of the half one per pass, and makes the copies' passes more
    copies = FP32_GRADIENT_PASSES if specs[master].precision.fp32_gradients else MASTER_COPY_PASSES
    assert moved[master] / moved[half] == pytest.approx(2 * (passes + copies) / passes, rel=0.1)


def test_a_cpu_that_faults_in_new_memory_slowly_pays_for_each_new_tensor_of_32_mib_or_more():
    """On a CPU entry with a rate of new memory (`first_touch_gb_s`, what `hw bench` measures), each row that makes
    a new tensor of `FRESH_MAP_BYTES` or more, and Adam's temporaries of each parameter that large, cost their bytes
    at that rate on top of the kernels; SGD's in-place step adds nothing, nor does a GPU. The batch sweep (a matrix
    of new batches) charges as one step at a time does."""
    from perfmodel.graph import graph_for_job
    from perfmodel.hardware.spec import FRESH_MAP_BYTES
    from perfmodel.lowering.ops import op_work
    from perfmodel.placement.spec import PlacementSpec
    from perfmodel.predictor.gpu_iteration import embedding_gradient_bytes, job_rows, optimizer_fresh_bytes
    from perfmodel.predictor.placed import PlacementPredictor
    from perfmodel.regressors.adaptation import AdaptedRegressor, DeviceAdaptation

    catalog = load_catalog()
    slow = catalog["cpu"].model_copy(update={"first_touch_gb_s": 2.0})
    shipped = DevicePredictor.load()
    # a CPU with its own measurements (as after `hw bench`): the device model answers it
    rng = np.random.default_rng(0)
    swept = pd.DataFrame({"op_class": "linear", "op_name": "linear", "dtype": "fp32", "device": "cpu", "batch": 1,
                          "m": 2 ** rng.integers(4, 10, 30), "n": 2 ** rng.integers(4, 10, 30),
                          "k": 2 ** rng.integers(4, 10, 30)})
    swept["latency_ms"] = 1.5 * shipped.regressor.predict(swept, catalog).latency_ms
    regressor = AdaptedRegressor(shipped.regressor, {"cpu": DeviceAdaptation.fit(shipped.regressor, swept, catalog)},
                                 catalog)
    device = DevicePredictor(regressor, shipped.model_version, {**catalog, "cpu": slow})
    plain = DevicePredictor(regressor, shipped.model_version, catalog)
    # GPT-2 (no head in the graph) with a 70,000-word embedding of 68 MiB in fp32, at a batch whose hidden states
    # are 32 MiB: a new tensor as large from every row that writes them
    config = {**TINY_GPT2, "n_embd": 256, "vocab_size": 70_000, "n_positions": 512}
    phases = ("forward", "backward", "optimizer")
    for optimizer, temporaries in (("adamw", 2), ("sgd", 0)):
        spec = JobSpec.from_options(hf_config=config, batch_size=64, seq_len=512, optimizer=optimizer)
        graph = graph_for_job(spec)
        rows = job_rows(spec, graph, slow).assign(device="cpu")
        written = op_work(rows).bytes_written
        large = ((written >= FRESH_MAP_BYTES) & (rows["phase"] != "optimizer").to_numpy()
                 & (rows["kind"] != "embedding").to_numpy())
        assert large.sum() >= 2
        params = sum(node.params * 4 for node in graph.nodes if node.params * 4 >= FRESH_MAP_BYTES)
        assert params == 70_000 * 256 * 4 and optimizer_fresh_bytes(graph, spec) == temporaries * params
        assert embedding_gradient_bytes(graph, spec) == params
        expected_ms = (written[large].sum() + (temporaries + 1) * params) / 2.0e9 * 1e3
        charged, as_before = (p.predict(spec, "cpu", graph=graph).breakdown_ms for p in (device, plain))
        assert sum(charged[k] - as_before[k] for k in phases) == pytest.approx(expected_ms, rel=1e-6)
        assert charged["optimizer"] - as_before["optimizer"] == pytest.approx(temporaries * params / 2.0e6)
        assert device.predict(spec, "t4", graph=graph) == plain.predict(spec, "t4", graph=graph)
    placements = [PlacementSpec(accelerator="cpu", global_batch_size=b) for b in (48, 80)]
    matrix = PlacementPredictor(None, device).matrix_arrays([spec], placements)
    for j, placement in enumerate(placements):
        alone = PlacementPredictor(None, device).predict(spec, placement).iter_time_ms
        assert matrix["iter_time_ms"][0, j] == pytest.approx(alone, rel=1e-9)

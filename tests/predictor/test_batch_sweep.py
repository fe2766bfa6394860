"""Every batch of a job from its graphs at two batches: the sweep composes what the graph made at each batch would,
memory reads the same, and the placement predictor serves a batch sweep without making a graph per batch (real
captures on the meta device, the shipped models)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.engine.graphs import GraphCache
from perfmodel.graph import graph_for_job
from perfmodel.graph.batch_affine import affine
from perfmodel.hardware.catalog import get_accelerator
from perfmodel.hardware.math import peak_gflops
from perfmodel.jobs.spec import JobSpec, Precision
from perfmodel.placement.spec import PlacementSpec
from perfmodel.predictor.batch_sweep import GraphLine, RowLine, Sweep
from perfmodel.predictor.gpu_iteration import DevicePredictor
from perfmodel.predictor.memory import GraphBytes, estimate_memory
from perfmodel.predictor.placed import PlacementPredictor

# a CNN, a transformer (attention rows batch x heads), an RNN (a GEMM per time step)
CASES = [("resnet18", None, "fp32"), ("resnet18", None, "amp"), ("bert-small", 32, "amp"), ("lstm-lm", 12, "fp32")]
BATCHES = (1, 3, 40)  # below, between and far beyond the two captures (2 and 5)


@pytest.fixture(scope="module")
def device() -> DevicePredictor:
    return DevicePredictor.load()


def _lines(name: str, seq_len: int | None, precision: str) -> tuple[JobSpec, object, GraphLine]:
    spec = JobSpec.from_options(zoo=name, batch_size=2, seq_len=seq_len, precision=precision)
    first, second = graph_for_job(spec), graph_for_job(spec.model_copy(update={"batch_size": 5}))
    model = affine(first, 2, second, 5)
    graphs = GraphLine.of(first, 2, second, 5)
    assert model is not None and graphs is not None
    return spec, model, graphs


@pytest.mark.parametrize("name,seq_len,precision", CASES)
def test_a_sweep_composes_what_each_batch_graph_would(device, name, seq_len, precision):
    spec, model, graphs = _lines(name, seq_len, precision)
    for accelerator in ("a100-sxm4-80gb", "t4"):
        hardware = get_accelerator(accelerator)
        rows = RowLine.of(spec, graphs, hardware, model.at(7), 7)
        assert rows is not None and len(rows.kernels) <= len(rows.rows)
        specs = [spec.model_copy(update={"batch_size": b}) for b in BATCHES]
        swept = device.predict_composed_sweeps([Sweep(specs, accelerator, rows, graphs)])[0]
        for micro, (step, features) in zip(specs, swept):
            want, want_features = device.predict_composed(micro, accelerator, graph=model.at(micro.batch_size))
            assert step.iter_time_ms == pytest.approx(want.iter_time_ms, rel=0.005)
            assert step.interval_ms == pytest.approx(want.interval_ms, rel=0.005)
            for part, value in want.breakdown_ms.items():
                assert step.breakdown_ms[part] == pytest.approx(value, rel=0.005, abs=1e-6), part
            assert step.peak_memory_bytes == pytest.approx(want.peak_memory_bytes, rel=0.005)
            assert step.extrapolation_reasons == want.extrapolation_reasons
            assert step.host_issue_ms == want.host_issue_ms and step.job_id == want.job_id
            assert set(features) == set(want_features)
            for feature, value in want_features.items():
                if np.isfinite(value):
                    assert features[feature] == pytest.approx(value, rel=0.005, abs=1e-3), feature


def test_rows_of_another_structure_have_no_line():
    spec, _, graphs = _lines("resnet18", None, "fp32")
    other = graph_for_job(JobSpec.from_options(zoo="resnet34", batch_size=7))
    assert RowLine.of(spec, graphs, get_accelerator("t4"), other, 7) is None
    assert GraphLine.of(graphs.first, 2, other, 7) is None


def test_what_memory_reads_is_on_the_line_and_estimates_the_same():
    spec, model, graphs = _lines("bert-small", 32, "amp")
    for batch in BATCHES:
        made = GraphBytes.of(model.at(batch), spec.precision)
        lined = graphs.graph_bytes(spec.precision, batch)
        assert np.abs(made.output_bytes - lined.output_bytes).max() <= 1
        assert made.block_outputs() == pytest.approx(lined.block_outputs(), abs=1)
        micro = spec.model_copy(update={"batch_size": batch})
        for options in ({}, {"data_parallel": 4, "zero_stage": 3}, {"activation_checkpointing": True}):
            want = estimate_memory(micro, model.at(batch), **options).peak_bytes
            assert estimate_memory(micro, lined, **options).peak_bytes == pytest.approx(want, rel=1e-6)
            assert estimate_memory(micro, made, **options).peak_bytes == want


def test_a_batch_sweep_is_served_from_two_captures_with_no_graph_per_batch():
    cache = GraphCache(100, isolated=False)
    spec = JobSpec.from_options(zoo="resnet18", batch_size=4)
    assert cache.prepare_batches(spec, cache.graph(spec))
    swept = PlacementPredictor.load(graphs=cache.graph, batch_models=cache.batch_model)
    plain = PlacementPredictor.load(graphs=cache.graph)
    placements = [PlacementSpec.grid(accelerator, nodes=1, per_node=devices, global_batch_size=micro * devices)
                  for accelerator in ("t4", "h100-sxm5") for devices in (1, 2, 8) for micro in (1, 5, 9, 33, 100)]
    made = cache.synthesized
    arrays = swept.matrix_arrays([spec], placements)
    assert cache.synthesized == made  # no graph made for any of the 5 micro-batches
    want = plain.matrix_arrays([spec], placements)
    assert cache.synthesized > made  # the plain predictor makes one per micro-batch
    assert arrays["throughput_samples_per_s"] == pytest.approx(want["throughput_samples_per_s"], rel=0.005)
    assert arrays["peak_memory_bytes"] == pytest.approx(want["peak_memory_bytes"], rel=0.005)
    one = swept.predict(spec, placements[7])
    assert one.throughput_samples_per_s == pytest.approx(arrays["throughput_samples_per_s"][0, 7], rel=1e-9)


def test_the_stage_corrects_many_steps_as_it_corrects_each(device):
    stage = PlacementPredictor.load().whole_step
    assert stage is not None
    spec, model, graphs = _lines("resnet18", None, "amp")
    rows = RowLine.of(spec, graphs, get_accelerator("a100-sxm4-80gb"), model.at(7), 7)
    specs = [spec.model_copy(update={"batch_size": b}) for b in BATCHES]
    steps = device.predict_composed_sweeps([Sweep(specs, "a100-sxm4-80gb", rows, graphs)])[0]
    many = stage.correct_many([s for s, _ in steps], [f for _, f in steps], ["resnet50:amp", None, None])
    for (single, features), job, corrected in zip(steps, ["resnet50:amp", None, None], many):
        assert corrected == stage.correct(single, features, job)
        assert corrected.iter_time_ms >= single.iter_time_ms * features["roofline_over_composed"] - 1e-9


@pytest.fixture(scope="module")
def swept_predictor():
    cache = GraphCache(100, isolated=False)
    spec = JobSpec.from_options(zoo="resnet18", batch_size=4, precision="amp")
    assert cache.prepare_batches(spec, cache.graph(spec))
    return spec, PlacementPredictor.load(graphs=cache.graph, batch_models=cache.batch_model)


GPUS = ["t4", "v100-sxm2-32gb", "a100-sxm4-80gb", "h100-sxm5", "l4", "mi250x"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(micro=st.integers(1, 512), gpu=st.sampled_from(GPUS), devices=st.sampled_from([1, 2, 4, 8]))
def test_answers_from_the_lines_stay_physical(swept_predictor, micro, gpu, devices):
    spec, predictor = swept_predictor
    one = predictor.predict(spec, PlacementSpec(accelerator=gpu, global_batch_size=micro))
    many = predictor.predict(spec, PlacementSpec.grid(gpu, nodes=1, per_node=devices,
                                                      global_batch_size=micro * devices))
    assert one.iter_time_ms == pytest.approx(sum(one.breakdown_ms.values()))
    assert one.interval_ms[0] <= one.iter_time_ms <= one.interval_ms[1]
    flops, _ = predictor._graph_line(spec).flops_and_bytes(np.array([micro]))
    peak = max(peak_gflops(get_accelerator(gpu), math, True) for math in ("fp16", "bf16", "fp32")) * 1e9
    assert flops[0] / (one.iter_time_ms / 1e3) <= peak  # never above the fastest math of the device
    assert many.throughput_samples_per_s <= devices * one.throughput_samples_per_s * (1 + 1e-9)  # never beyond linear
    bigger = predictor.predict(spec, PlacementSpec(accelerator=gpu, global_batch_size=micro + 1))
    assert bigger.peak_memory_bytes >= one.peak_memory_bytes  # a larger batch never needs less memory


@pytest.mark.parametrize("name,seq_len", [("resnet18", None), ("bert-small", 32)])
def test_a_float32_twins_line_is_the_jobs_in_the_twins_maths(name, seq_len):
    """`RowLine.in_maths`: a job's line in another float32 math, derived from its own, is the line `RowLine.of`
    makes from the graphs (the same rows, kernels and shapes; only the GEMMs' math differs)."""
    import pandas as pd

    spec, model, graphs = _lines(name, seq_len, "fp32-strict")
    hardware = get_accelerator("a100-sxm4-80gb")
    strict = RowLine.of(spec, graphs, hardware, model.at(7), 7)
    assert strict is not None
    for precision in (Precision.fp32, Precision.tf32):
        twin = spec.model_copy(update={"precision": precision})
        made, derived = RowLine.of(twin, graphs, hardware, model.at(7), 7), strict.in_maths(twin.precision, hardware)
        assert made is not None
        if precision == Precision.tf32:
            assert set(made.rows["math"]) != set(strict.rows["math"])  # other maths on an A100
        pd.testing.assert_frame_equal(derived.rows, made.rows)
        pd.testing.assert_frame_equal(derived.kernels, made.kernels)
        for field in ("codes", "first", "second", "nodes", "cuda_core"):
            np.testing.assert_array_equal(getattr(derived, field), getattr(made, field))


def test_a_cpu_adapted_from_its_own_depthwise_gradients_sweeps_as_each_batch_graph_would(device):
    """A depthwise convolution's gradient rows are priced apart from the forward kernel of their shape on a device
    adapted from rows of that part (`adaptation.PART_GROUPS`): the sweep keeps them apart as its distinct kernels
    (`lowering.ops.own_kernel_parts`), so it composes what each batch's graph would."""
    import pandas as pd

    from perfmodel.regressors.adaptation import AdaptedRegressor, DeviceAdaptation

    rng = np.random.default_rng(0)
    n = 40
    measured = pd.DataFrame({"op_class": "conv2d", "op_name": "conv2d", "dtype": "fp32", "device": "cpu",
                             "batch": 4 * rng.choice([96, 240, 480], n), "in_channels": 1, "out_channels": 1,
                             "kernel_size": rng.choice([3, 5], n), "input_size": rng.choice([14, 28, 56], n),
                             "stride": 1, "padding": 1, "part": "dW"})
    measured = measured.assign(latency_ms=device.regressor.predict(measured, device.catalog).latency_ms * 40)
    adaptation = DeviceAdaptation.fit(device.regressor, measured, device.catalog)
    adapted = DevicePredictor(AdaptedRegressor(device.regressor, {"cpu": adaptation}, device.catalog),
                              device.model_version, device.catalog)
    spec, model, graphs = _lines("mobilenet_v2", None, "fp32")
    rows = RowLine.of(spec, graphs, get_accelerator("cpu"), model.at(7), 7)
    assert rows is not None
    assert adapted.regressor.measured_kernels(rows.kernels_at(np.array([3]), "cpu")).any()
    specs = [spec.model_copy(update={"batch_size": b}) for b in BATCHES]
    swept = adapted.predict_composed_sweeps([Sweep(specs, "cpu", rows, graphs)])[0]
    for micro, (step, _) in zip(specs, swept):
        want, _ = adapted.predict_composed(micro, "cpu", graph=model.at(micro.batch_size))
        plain, _ = device.predict_composed(micro, "cpu", graph=model.at(micro.batch_size))
        assert step.iter_time_ms == pytest.approx(want.iter_time_ms, rel=0.005)
        assert want.iter_time_ms > 1.5 * plain.iter_time_ms  # the 40x gradients are priced as adapted

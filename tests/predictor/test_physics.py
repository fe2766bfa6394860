"""Nothing physically impossible, as properties over random (model, GPU, math mode) draws, with the shipped model:
no kernel above the peak FLOP/s of its math (for the least arithmetic a library may run it with: Winograd's for
a fp32 3 x 3 stride-1 convolution) or the device's memory bandwidth, no node's backward faster than its
forward where it does at least the forward's FLOPs, the step the explicit sum of its parts, and the math each
op group is priced at as the precision names it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.graph import graph_for_job
from perfmodel.hardware.catalog import load_catalog
from perfmodel.hardware.math import peak_gflops
from perfmodel.jobs.spec import JobSpec, Precision
from perfmodel.lowering.ops import least_arithmetic, moved_bytes, op_work, row_maths
from perfmodel.predictor import DevicePredictor
from perfmodel.predictor.device_ops import BACKWARD, FORWARD

TINY_BERT = {"model_type": "bert", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 128}
JOBS = {
    "resnet18": dict(zoo="resnet18", batch_size=16),
    "mobilenet_v2": dict(zoo="mobilenet_v2", batch_size=8, mode="inference"),
    "tiny-bert": dict(hf_config=TINY_BERT, task="question-answering", batch_size=4, seq_len=64, optimizer="adamw"),
}


@pytest.fixture(scope="module")
def predictor():
    return DevicePredictor.load()


@pytest.fixture(scope="module")
def graphs():
    return {name: graph_for_job(JobSpec.from_options(**job)) for name, job in JOBS.items()}


GPUS = sorted(name for name, spec in load_catalog().items() if spec.kind == "gpu")
draws = st.tuples(st.sampled_from(sorted(JOBS)), st.sampled_from(GPUS), st.sampled_from(list(Precision)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(draw=draws)
def test_no_kernel_beats_the_peak_of_its_math_or_the_bandwidth(predictor, graphs, draw):
    name, gpu, precision = draw
    spec = JobSpec.from_options(**{**JOBS[name], "precision": precision.value})
    hardware = predictor.catalog[gpu]
    rows, out = predictor.predict_rows(spec, hardware, graphs[name])
    work = op_work(rows)
    # a Winograd-shaped fp32 convolution's fewest multiplies
    flops = work.flops * least_arithmetic(rows, np.full(len(rows), hardware.architecture))
    seconds = out.latency_ms / 1e3
    gemm = rows["op_class"].isin(["bmm", "linear", "conv2d"]).to_numpy()
    peaks = np.array([peak_gflops(hardware, m, bool(g)) for m, g in zip(row_maths(rows), gemm)]) * 1e9
    assert np.all(flops / seconds <= peaks * (1 + 1e-9)), "a kernel above the peak of its math"
    bytes_per_s = moved_bytes(rows, work) / seconds  # a fused attention's scores stay on chip
    assert np.all(bytes_per_s <= hardware.memory_bandwidth_gb_s * 1e9 * (1 + 1e-9)), "a kernel above the bandwidth"
    # and so the step: its FLOPs over its time never above the fastest math it uses
    assert flops.sum() / seconds.sum() <= peaks.max() * (1 + 1e-9)

    # backward never faster than forward, node by node, where it does at least the forward's FLOPs
    heavy = {n.id for n in graphs[name].nodes if n.flops_fwd > 0 and n.flops_bwd >= n.flops_fwd}
    per_node = (rows.assign(ms=out.latency_ms)[rows["node_id"].isin(heavy)]
                .groupby(["node_id", "phase"])["ms"].sum().unstack(fill_value=0.0))
    if BACKWARD in per_node:
        both = per_node[(per_node[BACKWARD] > 0)]
        assert np.all(both[BACKWARD].to_numpy() >= both[FORWARD].to_numpy() * (1 - 1e-9))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(draw=draws)
def test_the_step_is_the_sum_of_its_parts_and_names_its_math(predictor, graphs, draw):
    name, gpu, precision = draw
    spec = JobSpec.from_options(**{**JOBS[name], "precision": precision.value})
    result = predictor.predict(spec, gpu, graph=graphs[name])
    assert result.iter_time_ms == pytest.approx(sum(result.breakdown_ms.values()))
    if spec.mode.value == "train":
        assert result.breakdown_ms["backward"] >= result.breakdown_ms["forward"]
    maths = result.math_by_op_group
    assert set(maths) == {"matmul", "conv", "autocast_fp32", "vector"}
    if precision in (Precision.amp, Precision.fp16):
        assert maths["matmul"] == maths["conv"] == "fp16"
    if precision == Precision.fp32_strict:
        assert set(maths.values()) == {"fp32"}
    if precision.autocast:
        assert maths["autocast_fp32"] == "fp32"


def test_fp32_runs_convolutions_in_tf32_where_the_gpu_has_it(predictor, graphs):
    """A plain fp32 script on an A100 gets TF32 convolutions (cuDNN's default) and fp32 matmuls; on a V100, fp32."""
    spec = JobSpec.from_options(**JOBS["resnet18"])
    a100 = predictor.predict(spec, "a100-sxm4-80gb", graph=graphs["resnet18"])
    assert a100.math_by_op_group["conv"] == "tf32" and a100.math_by_op_group["matmul"] == "fp32"
    assert any("TF32" in reason for reason in a100.extrapolation_reasons)
    strict = predictor.predict(spec.model_copy(update={"precision": Precision.fp32_strict}), "a100-sxm4-80gb",
                               graph=graphs["resnet18"])
    assert strict.iter_time_ms > a100.iter_time_ms  # the same convolutions on CUDA cores
    v100 = predictor.predict(spec, "v100-sxm2-32gb", graph=graphs["resnet18"])
    assert v100.math_by_op_group["conv"] == "fp32"


def test_amp_adds_weight_casts_and_the_grad_scaler(predictor, graphs):
    from perfmodel.predictor.gpu_iteration import job_rows

    hardware = predictor.catalog["a100-sxm4-80gb"]
    fp32 = JobSpec.from_options(**JOBS["tiny-bert"])
    amp = fp32.model_copy(update={"precision": Precision.amp})
    rows_fp32, rows_amp = (job_rows(s, graphs["tiny-bert"], hardware) for s in (fp32, amp))
    weights = sum(1 for n in graphs["tiny-bert"].nodes if n.kind.value in ("linear", "conv") and n.params > 0)
    # one cast kernel per GEMM weight in forward (fp32 -> fp16) and one per gradient in backward (fp16 -> fp32)
    assert (rows_amp["part"] == "weight_cast").sum() == 2 * weights > 0
    assert (rows_fp32["part"] == "weight_cast").sum() == 0
    # AdamW's 20 foreach passes (7 add kernels), plus the GradScaler's unscale under amp (8)
    assert (rows_fp32["phase"] == "optimizer").sum() == 7 and (rows_amp["phase"] == "optimizer").sum() == 8
    layernorm = rows_amp[rows_amp["kind"] == "layernorm"]
    assert len(layernorm) and set(layernorm["dtype"]) == {"fp32"}  # autocast runs layer norm in fp32
    assert set(rows_amp.loc[rows_amp["kind"] == "linear", "dtype"]) == {"fp16"}


def test_a_fused_optimizer_reads_and_writes_each_tensor_once(predictor, graphs):
    """A fused AdamW step moves each of param, grad and both moments in and the three updated ones out: 7 passes
    (rounded up to whole 3-pass kernels), against torch's foreach step's 20; every other row is the same."""
    import pandas as pd

    from perfmodel.predictor.gpu_iteration import FOREACH_TENSOR_PASSES, FUSED_TENSOR_PASSES, job_rows

    hardware = predictor.catalog["h100-sxm5"]
    spec, graph = JobSpec.from_options(**JOBS["tiny-bert"]), graphs["tiny-bert"]
    rows = {fused: job_rows(spec.model_copy(update={"fused_optimizer": fused}), graph, hardware)
            for fused in (False, True)}
    step = {fused: r[r["phase"] == "optimizer"] for fused, r in rows.items()}
    moved = {fused: float((op_work(s).bytes_read + op_work(s).bytes_written).sum()) / (4 * graph.totals.params)
             for fused, s in step.items()}
    assert FUSED_TENSOR_PASSES["adamw"] <= moved[True] < FUSED_TENSOR_PASSES["adamw"] + 3.1
    assert FOREACH_TENSOR_PASSES["adamw"] <= moved[False] < FOREACH_TENSOR_PASSES["adamw"] + 3.1
    rest = {fused: r[r["phase"] != "optimizer"].reset_index(drop=True) for fused, r in rows.items()}
    pd.testing.assert_frame_equal(rest[True], rest[False])


def test_a_host_bound_stream_waits_for_the_host():
    from perfmodel.predictor.gpu_iteration import host_bound_ms

    gpu = np.full(100, 0.002)  # 100 kernels of 2 us
    assert host_bound_ms(gpu, 0.0) == pytest.approx(0.2)  # the device alone
    assert host_bound_ms(gpu, 0.01) == pytest.approx(1.0 + 0.002)  # issued every 10 us: the host's pace
    big = np.full(100, 1.0)
    assert host_bound_ms(big, 0.01) == pytest.approx(100.0 + 0.01)  # long kernels hide the host but the first
    rng = np.random.default_rng(0)
    for _ in range(50):  # never below either bound, never above their sum
        g, h = rng.exponential(0.05, rng.integers(1, 300)), rng.uniform(0, 0.05)
        end = host_bound_ms(g, h)
        assert max(g.sum(), h * len(g)) - 1e-12 <= end <= g.sum() + h * len(g) + 1e-12


def _conv1d_graph(dilation: int):
    import torch
    from torch import nn

    from perfmodel.graph import graph_from_module

    model = nn.Sequential(nn.Conv1d(256, 512, 3, dilation=dilation, padding=dilation), nn.Tanh(),
                          nn.Conv1d(512, 256, 1))
    return graph_from_module(model, (torch.randn(8, 256, 2000, device="meta"),), name=f"conv1d-d{dilation}")


def test_a_dilated_convolution_runs_on_the_cuda_cores(predictor):
    """cuDNN has no tensor-core algorithm for a dilated convolution: under AMP or TF32 its kernels are priced at
    the fp32 peak (storage stays half), so it is never faster than the same convolution undilated; in fp32 on a GPU
    without tensor-core fp32 both are the same work."""
    from perfmodel.predictor.gpu_iteration import job_rows

    plain, dilated = _conv1d_graph(1), _conv1d_graph(4)
    assert [n.dilation for n in dilated.nodes if n.kind.value == "conv"] == [4, 1]
    assert all(n.dilation == 1 for n in plain.nodes)
    assert "\"dilation\"" not in plain.model_dump_json() and '"dilation":4' in dilated.model_dump_json()
    spec = JobSpec.from_options(zoo="resnet18", batch_size=8)
    for gpu, precision in (("a100-sxm4-80gb", "amp"), ("a100-sxm4-80gb", "tf32"), ("v100-sxm2-32gb", "amp")):
        job = spec.model_copy(update={"precision": Precision(precision)})
        hardware = predictor.catalog[gpu]
        rows = job_rows(job, dilated, hardware)
        first = rows[rows["node_id"] == dilated.nodes[0].id]
        last = rows[rows["node_id"] == dilated.nodes[-1].id]  # the undilated 1x1 conv keeps the mode's math
        assert set(first["math"]) == {"fp32"} and set(last["math"]) != {"fp32"}
        if precision == "amp":
            assert set(first.loc[first["op_class"] == "linear", "dtype"]) == {"fp16"}
        slower = predictor.predict(job, gpu, graph=dilated).iter_time_ms
        assert slower > 1.5 * predictor.predict(job, gpu, graph=plain).iter_time_ms
    fp32 = spec.model_copy(update={"precision": Precision.fp32_strict})
    assert predictor.predict(fp32, "v100-sxm2-32gb", graph=dilated).iter_time_ms == pytest.approx(
        predictor.predict(fp32, "v100-sxm2-32gb", graph=plain).iter_time_ms, rel=0.05)


def test_no_k80_kernel_beats_the_rate_its_warp_schedulers_can_issue(predictor, graphs):
    """Kepler's SMX has 192 fp32 lanes and four warp schedulers of 32: kernels are priced at 128 / 192 of the
    datasheet peak at most (`perfmodel.hardware.math.fp32_issue_fraction`), for their direct FLOPs: no measurement
    shows a Kepler convolution faster than that (`perfmodel.lowering.ops.WINOGRAD_UNMEASURED`)."""
    k80 = predictor.catalog["k80"]
    rows, out = predictor.predict_rows(JobSpec.from_options(**JOBS["resnet18"]), k80, graphs["resnet18"])
    achieved_gflops = op_work(rows).flops / (out.latency_ms / 1e3) / 1e9
    assert achieved_gflops.max() > 0.2 * k80.peak_fp32_gflops  # convolutions do run near that rate
    assert np.all(achieved_gflops <= k80.peak_fp32_gflops * 128 / 192 * (1 + 1e-9))


@pytest.mark.parametrize("gpu", ["v100-sxm2-16gb", "t4", "a100-sxm4-40gb", "h100-sxm5"])
def test_a_spec_sheet_without_its_architecture_is_priced_as_the_catalog_part(predictor, graphs, gpu):
    """A user's sheet that copies a catalog GPU's figures but names no architecture gets the same kernels: tensor
    cores are read from its peaks (it was priced up to a third slower, as if GEMMs ran on CUDA cores)."""
    spec = JobSpec.from_options(**{**JOBS["tiny-bert"], "precision": "amp"})
    hardware = predictor.catalog[gpu]
    sheet = hardware.model_copy(update={"name": f"my-{gpu}", "aliases": (), "architecture": None})
    with_sheet = DevicePredictor(predictor.regressor, predictor.model_version, {**predictor.catalog, sheet.name: sheet})
    _, shipped = predictor.predict_rows(spec, hardware, graphs["tiny-bert"])
    _, custom = with_sheet.predict_rows(spec, sheet, graphs["tiny-bert"])
    assert custom.latency_ms.sum() == pytest.approx(shipped.latency_ms.sum(), rel=1e-9)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(JOBS)), rate=st.floats(0.5, 50.0), slower=st.floats(0.1, 1.0),
       large=st.booleans())
def test_a_cpus_charge_for_new_memory_only_adds_time_and_never_less_at_a_slower_rate(predictor, graphs, name, rate,
                                                                                       slower, large):
    """On a CPU with a rate of new memory (`first_touch_gb_s`), no row is cheaper than without one, and none is
    cheaper at a slower rate: less bandwidth for new pages never speeds a step up."""
    job = JOBS[name]
    if large:  # an embedding and hidden states past the 32 MiB a new tensor is mapped afresh at
        job = dict(hf_config={**TINY_BERT, "vocab_size": 70_000, "hidden_size": 256, "max_position_embeddings": 512},
                   task="question-answering", batch_size=64, seq_len=512, optimizer="adamw")
    spec = JobSpec.from_options(**job)
    graph = graphs[name] if not large else graph_for_job(spec)
    cpu = predictor.catalog["cpu"]
    times = [predictor.predict_rows(spec, cpu.model_copy(update={"first_touch_gb_s": r}), graph)[1].latency_ms
             for r in (None, rate, rate * slower)]
    assert np.all(times[1] >= times[0]) and np.all(times[2] >= times[1] * (1 - 1e-12))
    if large:
        assert times[1].sum() > times[0].sum()

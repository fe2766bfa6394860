"""estimate_memory from what autograd saves (GraphTotals.saved_activation_bytes[_amp]) and the optimizer step's
temporaries; the placement invariants hold with them."""

import itertools

import pytest

from perfmodel.core.ir import Graph
from perfmodel.hardware.catalog import get_accelerator
from perfmodel.jobs.spec import JobSpec, Mode, OptimizerName, Precision, ZooSource
from perfmodel.predictor.memory import OPTIMIZER_TEMPORARIES, MemoryEstimate, estimate_memory, fits
from tests.predictor.test_memory import _graph  # the same stack of blocks

PLAIN = _graph()  # no measurement: the outputs rule


def _measured(graph: Graph, fraction: float = 0.5, amp_fraction: float = 0.3) -> Graph:
    """`graph` with saved-activation figures, `fraction` (`amp_fraction` under amp) of its outputs."""
    totals = graph.totals.model_copy(update={
        "saved_activation_bytes": int(graph.totals.activation_bytes * fraction),
        "saved_activation_bytes_amp": int(graph.totals.activation_bytes * amp_fraction)})
    return graph.model_copy(update={"totals": totals})


MEASURED = _measured(PLAIN)


def _spec(**kw) -> JobSpec:
    return JobSpec(source=ZooSource(name="resnet18"), batch_size=kw.pop("batch_size", 8), **kw)


def _sum(est: MemoryEstimate) -> int:
    return (est.weights_bytes + est.gradients_bytes + est.optimizer_bytes + est.activations_bytes
            + est.temporaries_bytes + est.workspace_bytes)


def test_measured_figure_replaces_the_outputs_rule():
    for precision in (Precision.fp32, Precision.amp):
        plain, measured = (estimate_memory(_spec(precision=precision), g) for g in (PLAIN, MEASURED))
        assert measured.peak_bytes == _sum(measured)
        assert measured.activations_bytes < plain.activations_bytes
        assert (measured.weights_bytes, measured.gradients_bytes) == (plain.weights_bytes, plain.gradients_bytes)
    fp32 = estimate_memory(_spec(), MEASURED)
    amp = estimate_memory(_spec(precision=Precision.amp), MEASURED)
    assert amp.activations_bytes < fp32.activations_bytes  # the autocast figure under amp
    # an all-saved figure equals the rule's fp32 figure: the rule is the upper bound
    everything = _measured(PLAIN, 1.0, 1.0)
    assert estimate_memory(_spec(), everything).activations_bytes == estimate_memory(_spec(), PLAIN).activations_bytes


def test_the_optimizer_step_peaks_for_large_models_at_small_batches():
    """Foreach Adam allocates one state-sized buffer per parameter while every gradient is alive; SGD none."""
    big = _measured(_graph(batch=1, params_per_layer=50_000_000))
    adam = estimate_memory(_spec(batch_size=1, optimizer=OptimizerName.adam), big)
    params = big.totals.params
    assert OPTIMIZER_TEMPORARIES[OptimizerName.adam] == 1
    assert adam.temporaries_bytes == 4 * params and adam.activations_bytes == 0
    assert adam.peak_bytes == _sum(adam)
    half = estimate_memory(_spec(batch_size=1, optimizer=OptimizerName.adam, precision=Precision.fp16), big)
    assert half.temporaries_bytes == 2 * params
    sgd = estimate_memory(_spec(batch_size=1, optimizer=OptimizerName.sgd), big)
    assert sgd.temporaries_bytes == 0 and sgd.activations_bytes > 0
    zero1 = estimate_memory(_spec(batch_size=1, optimizer=OptimizerName.adam), big, data_parallel=8, zero_stage=1)
    assert zero1.temporaries_bytes <= adam.temporaries_bytes // 8 + 1  # sharded like the optimizer state
    inference = estimate_memory(_spec(batch_size=1, mode=Mode.inference, optimizer=OptimizerName.adam), big)
    assert inference.temporaries_bytes == 0
    # at a training batch, the activations dominate again
    assert estimate_memory(_spec(optimizer=OptimizerName.adam), MEASURED).temporaries_bytes == 0


@pytest.mark.parametrize("precision", list(Precision))
@pytest.mark.parametrize("dp", [1, 2, 8])
def test_zero_stages_never_increase_memory(precision, dp):
    for graph in (MEASURED, _measured(_graph(batch=1, params_per_layer=50_000_000))):
        spec = _spec(optimizer=OptimizerName.adam, precision=precision)
        peaks = [estimate_memory(spec, graph, data_parallel=dp, zero_stage=z).peak_bytes for z in range(4)]
        assert all(b <= a for a, b in itertools.pairwise(peaks)), peaks


@pytest.mark.parametrize("placement", [{}, {"tensor_parallel": 2}, {"pipeline_parallel": 4, "micro_batch_size": 2},
                                       {"data_parallel": 4, "zero_stage": 3}])
def test_checkpointing_never_increases_memory(placement):
    plain = estimate_memory(_spec(), MEASURED, **placement)
    ckpt = estimate_memory(_spec(), MEASURED, activation_checkpointing=True, **placement)
    assert ckpt.activations_bytes <= plain.activations_bytes and ckpt.peak_bytes <= plain.peak_bytes


def test_micro_batches_scale_activations_linearly():
    """A micro-batch holds its share of the stored activations: the activations' share of the peak grows by the
    same bytes per sample (the gradients it overlaps with are a constant offset)."""
    spec, graph = _spec(batch_size=8), _measured(_graph(params_per_layer=8))  # gradients below one sample's
    parts = [estimate_memory(spec, graph, micro_batch_size=m).activations_bytes for m in (1, 2, 4, 8)]
    per_sample = (parts[3] - parts[0]) / 7
    assert per_sample > 0
    for m, part in zip((2, 4), parts[1:3]):
        assert part == pytest.approx(parts[0] + (m - 1) * per_sample, abs=2)
    assert graph.totals.saved_activation_bytes and per_sample * 8 == pytest.approx(
        graph.totals.saved_activation_bytes, rel=1e-6)


def test_tensor_parallel_and_inference():
    one = estimate_memory(_spec(optimizer=OptimizerName.adam), MEASURED)
    two = estimate_memory(_spec(optimizer=OptimizerName.adam), MEASURED, tensor_parallel=2)
    assert two.activations_bytes <= one.activations_bytes // 2 + 1 and two.peak_bytes < one.peak_bytes
    # inference frees activations as it goes: the measurement (a training forward) does not apply
    inference = _spec(mode=Mode.inference)
    assert (estimate_memory(inference, _graph(mode="inference"))
            == estimate_memory(inference, _measured(_graph(mode="inference"))))


@pytest.fixture(scope="module")
def resnet50_amp_1280() -> tuple[JobSpec, Graph]:
    from perfmodel.graph import capture_graph

    spec = JobSpec(source=ZooSource(name="resnet50"), batch_size=1280, precision=Precision.amp,
                   optimizer=OptimizerName.sgd)
    return spec, capture_graph(spec)


def test_resnet50_amp_batch_1280_fits_an_80gb_a100(resnet50_amp_1280):
    """Lambda's benchmark trains ResNet-50 at 1280 images per 80 GB A100 with AMP; every output counted (the
    old rule, ~101 GB) says it does not fit. What autograd saves under autocast: ~44 KB an image (~57 GB)."""
    spec, graph = resnet50_amp_1280
    gpu = get_accelerator("a100-sxm4-80gb")
    estimate = estimate_memory(spec, graph)
    assert fits(estimate, gpu)
    assert 40e9 < estimate.peak_bytes < 70e9
    rule = graph.model_copy(update={"totals": graph.totals.model_copy(
        update={"saved_activation_bytes": None, "saved_activation_bytes_amp": None})})
    assert not fits(estimate_memory(spec, rule), gpu)

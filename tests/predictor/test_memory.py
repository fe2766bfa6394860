"""estimate_memory: the explicit sum, placement shards (tensor/pipeline/ZeRO), checkpointing, precision, fits."""

import itertools

import pytest

from perfmodel.core.ir import Graph, GraphTotals, Node, TensorMeta
from perfmodel.core.opkinds import OpKind
from perfmodel.hardware.catalog import get_accelerator
from perfmodel.jobs.spec import JobSpec, Mode, OptimizerName, Precision, ZooSource
from perfmodel.predictor.memory import (
    MemoryEstimate,
    bytes_per_param,
    estimate_memory,
    fits,
    layer_key,
    layers,
    optimizer_temporary_bytes,
    shared_capacity_bytes,
    usable_memory_bytes,
)


def _graph(layers_: int = 8, hidden: int = 256, batch: int = 8, params_per_layer: int | None = None,
           mode: str = "train") -> Graph:
    """A stack of `layers_` blocks (linear + gelu + linear + add) over a [batch, 128, hidden] activation."""
    act = TensorMeta(shape=(batch, 128, hidden), dtype="float32")
    wide = TensorMeta(shape=(batch, 128, 4 * hidden), dtype="float32")
    p = params_per_layer if params_per_layer is not None else 8 * hidden * hidden
    nodes = [Node(id="embed", op="aten.embedding", kind=OpKind.embedding, output_tensors=(act,), params=1000 * hidden,
                  module="embed")]
    for i in range(layers_):
        prefix = f"model.layers.{i}"
        nodes += [
            Node(id=f"fc1_{i}", op="aten.linear", kind=OpKind.linear, output_tensors=(wide,), params=p // 2,
                 module=f"{prefix}.mlp.fc1"),
            Node(id=f"act_{i}", op="aten.gelu", kind=OpKind.activation, output_tensors=(wide,),
                 module=f"{prefix}.mlp.act"),
            Node(id=f"fc2_{i}", op="aten.linear", kind=OpKind.linear, output_tensors=(act,), params=p // 2,
                 module=f"{prefix}.mlp.fc2"),
            Node(id=f"add_{i}", op="aten.add", kind=OpKind.elementwise, output_tensors=(act,), module=prefix),
        ]
    params = sum(n.params for n in nodes)
    activation_bytes = sum(t.numel * 4 for n in nodes for t in n.output_tensors)
    totals = GraphTotals.from_nodes(nodes, params=params, param_bytes=4 * params, activation_bytes=activation_bytes)
    return Graph(name="stack", source="torch.export", mode=mode, nodes=tuple(nodes), totals=totals)


def _spec(**kw) -> JobSpec:
    return JobSpec(source=ZooSource(name="resnet18"), batch_size=kw.pop("batch_size", 8), **kw)


GRAPH = _graph()


def test_peak_is_the_explicit_sum():
    est = estimate_memory(_spec(optimizer=OptimizerName.adam), GRAPH)
    assert est.peak_bytes == (est.weights_bytes + est.gradients_bytes + est.optimizer_bytes + est.activations_bytes
                              + est.temporaries_bytes + est.workspace_bytes)
    params = GRAPH.totals.params
    assert (est.weights_bytes, est.gradients_bytes, est.optimizer_bytes) == (4 * params, 4 * params, 8 * params)
    assert 0 < est.activations_bytes <= GRAPH.totals.activation_bytes


@pytest.mark.parametrize(("precision", "optimizer", "total"), [
    (Precision.fp32, OptimizerName.sgd, 12), (Precision.fp32, OptimizerName.adam, 16),
    (Precision.fp16, OptimizerName.adam, 8), (Precision.bf16, OptimizerName.sgd, 6),
    (Precision.amp, OptimizerName.adam, 16), (Precision.amp, OptimizerName.adamw, 16),
    (Precision.amp, OptimizerName.sgd, 12),
    # apex O2 / DeepSpeed fp16: half weights and gradients, fp32 master weights and states (the ZeRO paper's 16)
    (Precision.fp16_master, OptimizerName.adam, 16), (Precision.fp16_master, OptimizerName.sgd, 12),
    # Megatron-LM bf16: fp32 gradients accumulated through backward, 2 bytes more
    (Precision.bf16_master, OptimizerName.adam, 18), (Precision.bf16_master, OptimizerName.sgd, 14),
])
def test_bytes_per_param(precision, optimizer, total):
    assert bytes_per_param(precision, optimizer).total == total


@pytest.mark.parametrize(("master", "half"), [(Precision.fp16_master, Precision.fp16),
                                              (Precision.bf16_master, Precision.bf16)])
def test_master_weights_cost_the_fp32_copies_not_activations(master, half):
    """A half model with fp32 master weights holds the half model's activations and weights and, in the optimizer,
    fp32 weights and states. Its fp32 gradients are either a step temporary (fp16-master: apex allocates the copy
    after backward and frees it at zero_grad) or persistent buffers in place of the half gradients (bf16-master:
    Megatron-LM's main_grad). Inference keeps the half weights only."""
    half_graph = _graph()
    spec = _spec(optimizer=OptimizerName.adamw, precision=half)
    plain, with_master = estimate_memory(spec, half_graph), estimate_memory(
        spec.model_copy(update={"precision": master}), half_graph)
    params = half_graph.totals.params
    gradients = 2 * plain.gradients_bytes if master.fp32_gradients else plain.gradients_bytes
    assert (with_master.weights_bytes, with_master.gradients_bytes) == (plain.weights_bytes, gradients)
    assert with_master.optimizer_bytes == (4 + 8) * params == 3 * plain.optimizer_bytes
    assert with_master.peak_bytes > plain.peak_bytes
    assert bytes_per_param(master, OptimizerName.adam, Mode.inference) == bytes_per_param(
        half, OptimizerName.adam, Mode.inference)
    copy = 0 if master.fp32_gradients else 1  # the step's fp32 copy of half gradients
    assert optimizer_temporary_bytes(master, OptimizerName.adam) == (1 + copy) * 4  # sqrt(v) + eps
    assert optimizer_temporary_bytes(master, OptimizerName.sgd) == copy * 4
    assert optimizer_temporary_bytes(Precision.amp, OptimizerName.sgd) == 0


@pytest.mark.parametrize("precision", [Precision.fp32, Precision.amp, Precision.fp16_master, Precision.bf16_master])
def test_a_fused_optimizer_allocates_no_temporaries_and_a_master_step_still_copies(precision):
    """A fused step computes each element's update in registers: no state-sized temporary, whatever the
    optimizer; a master-weight step's fp32 copy of half gradients stays (apex and DeepSpeed make it apart). At a
    batch of 1, where foreach Adam's temporaries are the step's peak, the fused job needs less memory."""
    copy = 4 if precision.master_weights and not precision.fp32_gradients else 0
    for optimizer in OptimizerName:
        assert optimizer_temporary_bytes(precision, optimizer, fused=True) == copy
        assert optimizer_temporary_bytes(precision, optimizer) >= copy
    small = _graph(batch=1, params_per_layer=4_000_000)
    spec = _spec(optimizer=OptimizerName.adam, precision=precision, batch_size=1)
    foreach, fused = (estimate_memory(s, small) for s in (spec, spec.model_copy(update={"fused_optimizer": True})))
    assert foreach.temporaries_bytes > 0 and fused.temporaries_bytes < foreach.temporaries_bytes
    assert fused.peak_bytes < foreach.peak_bytes
    assert (fused.weights_bytes, fused.gradients_bytes, fused.optimizer_bytes) == (
        foreach.weights_bytes, foreach.gradients_bytes, foreach.optimizer_bytes)


def test_bf16_master_all_reduces_its_fp32_gradient_buffers_in_place():
    """Data parallelism: DistributedDataParallel keeps a bucket copy of the gradients; Megatron-LM's fp32 gradient
    buffers are what it all-reduces, no copy beside them."""
    half_graph = _graph()
    spec = _spec(optimizer=OptimizerName.adam, precision=Precision.bf16_master)
    one = estimate_memory(spec, half_graph)
    four = estimate_memory(spec, half_graph, data_parallel=4, gradient_bucket_copy=True)
    assert four.gradient_buckets_bytes == 0 and four.gradients_bytes == one.gradients_bytes
    apex = spec.model_copy(update={"precision": Precision.fp16_master})
    assert estimate_memory(apex, half_graph, data_parallel=4, gradient_bucket_copy=True).gradient_buckets_bytes == (
        estimate_memory(apex, half_graph).gradients_bytes)


def test_amp_halves_float_activations():
    fp32 = estimate_memory(_spec(), GRAPH)
    amp = estimate_memory(_spec(precision=Precision.amp), GRAPH)
    assert amp.activations_bytes < fp32.activations_bytes


def test_tensor_parallel_halves_state():
    one = estimate_memory(_spec(optimizer=OptimizerName.adam), GRAPH)
    two = estimate_memory(_spec(optimizer=OptimizerName.adam), GRAPH, tensor_parallel=2)
    assert two.weights_bytes == one.weights_bytes // 2
    assert two.gradients_bytes == one.gradients_bytes // 2
    assert two.optimizer_bytes == one.optimizer_bytes // 2
    assert two.activations_bytes <= one.activations_bytes


@pytest.mark.parametrize("precision", list(Precision))
@pytest.mark.parametrize("dp", [1, 2, 8])
def test_zero_stages_never_increase_memory(precision, dp):
    spec = _spec(optimizer=OptimizerName.adam, precision=precision)
    peaks = [estimate_memory(spec, GRAPH, data_parallel=dp, zero_stage=z).peak_bytes for z in range(4)]
    assert all(b <= a for a, b in itertools.pairwise(peaks)), peaks
    if dp > 1:
        assert peaks[3] < peaks[0]
        z = [estimate_memory(spec, GRAPH, data_parallel=dp, zero_stage=s) for s in range(4)]
        assert z[1].optimizer_bytes < z[0].optimizer_bytes
        assert z[2].gradients_bytes < z[1].gradients_bytes
        assert z[3].weights_bytes < z[2].weights_bytes


@pytest.mark.parametrize("precision", [Precision.fp32, Precision.amp, Precision.bf16])
def test_data_parallel_replicas_keep_a_copy_of_their_gradients_in_buckets_when_asked(precision):
    """torch DDP's default buckets (`gradient_bucket_copy`) hold every gradient again; buckets that are the
    gradients (the default: apex's, Megatron-LM's, DeepSpeed's, `gradient_as_bucket_view=True`), one device, ZeRO
    and inference have none; the peak is the explicit sum with the buckets in it."""
    spec = _spec(optimizer=OptimizerName.adam, precision=precision)
    alone = estimate_memory(spec, GRAPH)
    lean = estimate_memory(spec, GRAPH, data_parallel=4)
    ddp = estimate_memory(spec, GRAPH, data_parallel=4, gradient_bucket_copy=True)
    assert alone.gradient_buckets_bytes == lean.gradient_buckets_bytes == 0 and alone.peak_bytes == lean.peak_bytes
    assert ddp.gradient_buckets_bytes == ddp.gradients_bytes > 0
    assert ddp.peak_bytes - alone.peak_bytes == ddp.gradient_buckets_bytes + ddp.workspace_bytes - alone.workspace_bytes
    assert ddp.peak_bytes == (ddp.weights_bytes + ddp.gradients_bytes + ddp.optimizer_bytes + ddp.activations_bytes
                              + ddp.temporaries_bytes + ddp.gradient_buckets_bytes + ddp.workspace_bytes)
    assert estimate_memory(spec, GRAPH, gradient_bucket_copy=True) == alone  # one device all-reduces nothing
    for zero in (1, 2, 3):
        assert estimate_memory(spec, GRAPH, data_parallel=4, zero_stage=zero,
                               gradient_bucket_copy=True).gradient_buckets_bytes == 0
    inference = _spec(mode=Mode.inference, precision=precision)
    assert estimate_memory(inference, _graph(mode="inference"), data_parallel=4,
                           gradient_bucket_copy=True).gradient_buckets_bytes == 0


@pytest.mark.parametrize("placement", [{}, {"tensor_parallel": 2}, {"pipeline_parallel": 4, "micro_batch_size": 2},
                                       {"data_parallel": 4, "zero_stage": 3}])
def test_checkpointing_never_increases_activations(placement):
    spec = _spec()
    plain = estimate_memory(spec, GRAPH, **placement)
    ckpt = estimate_memory(spec, GRAPH, activation_checkpointing=True, **placement)
    assert ckpt.activations_bytes <= plain.activations_bytes
    assert ckpt.peak_bytes <= plain.peak_bytes
    if not placement:
        assert ckpt.activations_bytes < plain.activations_bytes


def test_pipeline_stages_shrink_weights():
    spec = _spec(optimizer=OptimizerName.adam)
    stages = [estimate_memory(spec, GRAPH, pipeline_parallel=pp) for pp in (1, 2, 4)]
    assert stages[0].weights_bytes > stages[1].weights_bytes > stages[2].weights_bytes
    assert stages[0].optimizer_bytes > stages[1].optimizer_bytes > stages[2].optimizer_bytes


def test_pipeline_first_stage_keeps_micro_batches_in_flight():
    spec = _spec(batch_size=8)
    one_micro = estimate_memory(spec, GRAPH, pipeline_parallel=4, micro_batch_size=8)  # 1 micro-batch in flight
    four_micro = estimate_memory(spec, GRAPH, pipeline_parallel=4, micro_batch_size=2)  # 4 in flight of 1/4 size
    assert four_micro.activations_bytes <= one_micro.activations_bytes
    assert four_micro.activations_bytes > 0


def test_inference_has_no_gradients_or_optimizer():
    est = estimate_memory(_spec(mode=Mode.inference, optimizer=OptimizerName.adam), _graph(mode="inference"))
    assert est.gradients_bytes == 0 and est.optimizer_bytes == 0
    assert est.weights_bytes == 4 * GRAPH.totals.params
    half = estimate_memory(_spec(mode=Mode.inference, precision=Precision.fp16), _graph(mode="inference"))
    assert half.weights_bytes == 2 * GRAPH.totals.params


def test_fits():
    gpu = get_accelerator("a100-sxm4-80gb")
    big = _graph(layers_=96, hidden=256, params_per_layer=175_000_000_000 // 96)
    assert big.totals.params > 175e9
    assert not fits(estimate_memory(_spec(precision=Precision.fp16, mode=Mode.inference), big), gpu)
    assert not fits(estimate_memory(_spec(precision=Precision.fp16, optimizer=OptimizerName.adam), big), gpu)
    assert fits(estimate_memory(_spec(), _graph(layers_=2, hidden=64)), gpu)
    assert fits(MemoryEstimate(0, 0, 0, 0, 0), gpu)


def test_jobs_sharing_a_device_each_hold_a_context():
    """Two co-located jobs are two processes: together they may use one job's capacity less one more context."""
    a100 = get_accelerator("a100-sxm4-80gb")
    one = usable_memory_bytes(a100)
    assert shared_capacity_bytes(one, 1) == one == 79 * 2**30
    assert shared_capacity_bytes(one, 2) == 78 * 2**30 and shared_capacity_bytes(2**29, 2) == 0


def test_capacity_is_binary_memory_less_the_context():
    """An "80GB" A100 holds 80 GiB (nvidia-smi: 81,920 MiB); the CUDA context takes the same GiB off an 8 GB laptop
    part as off it, so a job may use 79 GiB there and 7 GiB on the laptop: the boundary is exact."""
    a100, laptop = get_accelerator("a100-sxm4-80gb"), get_accelerator("rtx-2070-max-q")
    assert a100.memory_bytes == 80 * 2**30
    assert usable_memory_bytes(a100) == 79 * 2**30 and usable_memory_bytes(laptop) == 7 * 2**30
    for gpu in (a100, laptop):
        room = usable_memory_bytes(gpu)
        assert fits(MemoryEstimate(room, 0, 0, 0, 0), gpu) and not fits(MemoryEstimate(room + 1, 0, 0, 0, 0), gpu)


def test_invalid_placements_are_rejected():
    with pytest.raises(ValueError):
        estimate_memory(_spec(), GRAPH, tensor_parallel=0)
    with pytest.raises(ValueError):
        estimate_memory(_spec(), GRAPH, zero_stage=4)


def test_layers_follow_repeated_blocks():
    assert layer_key("model.layers.3.self_attn.q_proj") == "model.layers.3"
    assert layer_key("stages.2.blocks.0.mlp.fc1") == "stages.2.blocks.0"
    assert layer_key("Mixed_5b.branch1x1.conv") == "Mixed_5b"
    assert layer_key(None) is None
    assert len(layers(GRAPH)) == 1 + 8

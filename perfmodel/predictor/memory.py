"""Peak memory of one device from the graph alone: weights + gradients + optimizer state + activations +
optimizer-step temporaries + data parallelism's gradient buckets + workspace (explicit sum,
`MemoryEstimate.peak_bytes`), for one shard of a placement.

Conventions
-----------
The graph (and `spec.batch_size`) is the batch ONE data-parallel replica processes per optimizer step; the
placement options only say how that replica's model is split (tensor / pipeline parallel) and how its training
state is sharded over the data-parallel ranks (ZeRO). Bytes are exact integers; GB are 1e9 bytes.

Bytes per parameter (training), `P` = parameters of the shard (as in the ZeRO paper, Rajbhandari et al. 2020,
section 3.1: mixed-precision Adam = 2 + 2 + 12 = 16 bytes/param):

    precision   weights  gradients  optimizer state                       SGD(momentum)  Adam/AdamW
    fp32          4         4       states x 4                              12             16
    fp16/bf16     2         2       states x 2 (torch keeps them in the     6              8
                                    parameters' dtype)
    amp           2         2       4 (fp32 master weights) + states x 4    12             16
    fp16-master   2         2       4 (fp32 master weights) + states x 4    12             16
    bf16-master   2         4       4 (fp32 master weights) + states x 4    14             18

`states` (`OPTIMIZER_STATES`) is 1 for SGD (momentum buffer) and 2 for Adam/AdamW (first and second moments).
amp follows the ZeRO / Megatron split (half working weights and gradients, fp32 master weights counted as
optimizer state, so ZeRO-1 shards them). torch autocast as the profiler runs it keeps fp32 weights and fp32
gradients instead (4 + 4 + states x 4): the same 16 bytes/param for Adam without ZeRO, split differently.
`fp16-master` keeps what apex AMP O2 and DeepSpeed's fp16 optimizer keep through forward and backward: the half
model and its half gradients, the fp32 master weights and the optimizer's fp32 states; the fp32 copy of the
gradients the master step reads exists only at the step (apex allocates it after backward and `zero_grad` frees
it), an optimizer-step temporary (`optimizer_temporary_bytes`). `bf16-master` accumulates the gradients in
persistent fp32 buffers through backward instead (`Precision.fp32_gradients`: Megatron-LM's `main_grad`, which it
requires for bf16), 2 bytes more per parameter, and its step reads them as they are. Inference keeps only
weights: 4 bytes/param for fp32 and amp (autocast leaves weights fp32), 2 for the half models.

Activations
-----------
Training keeps for backward what autograd saves. A graph captured from PyTorch carries it, measured
(`GraphTotals.saved_activation_bytes`, and `saved_activation_bytes_amp` under amp; `perfmodel.graph.saved`): the
bytes of the distinct storages one forward saves, plus its outputs and inputs, parameters excluded, from a forward
on the meta device. That is the physics, where the graph's outputs are an upper bound: an in-place ReLU adds no
storage, ResNet's BatchNorm output modified by `relu_` and read by the next conv is one tensor, an add's output no
backward reads is not kept, and SDPA keeps no seq x seq probabilities (CUDA's memory-efficient kernel). Checked on
the CPU (`bench/memory_fit.py --cpu-check`, fp32): with the CPU's kernels the measurement equals what real steps of
resnet18, resnet50, vit_small, bert-small, bert-base and gpt2 save, and the steps' allocator high-water is 1-5 %
above the estimate's gradients + activations (lstm-lm: 31 %, oneDNN's LSTM workspace is not the decomposed meta
LSTM's saved gates), where the outputs rule was 41-64 % above for the ResNets and ViT, 30 % below for bert-base.
Under amp the measurement emulates CUDA autocast: the half copies autocast saves (inputs of matmuls and
convolutions, the parameters' cached casts, 2 bytes/param) next to the float32 tensors of the ops it keeps in
float32 (softmax, layer_norm, losses). Graphs without the measurement (ONNX, hand-built, IR written before it)
fall back on every compute node's output (`Graph.totals.activation_bytes`, views excluded), float32 outputs
counting 2 bytes per element under amp (autocast runs compute in half precision; graphs are captured on the meta
device without autocast, so their dtypes say float32).

Backward frees the activations in reverse order while it produces the gradients, so activations and gradients
are not all alive at once: the step's peak of the two is max over the backward position i of (activations of
nodes <= i + gradients of the parameters of nodes >= i) (`backward_overlap_bytes`; a node's share of the measured
activations is its share of the graph's outputs), and `activations_bytes` is that peak minus `gradients_bytes`
(the activations' share at the peak; `peak_bytes` stays an explicit sum). It is between 0 and the stored
activations. Inference frees each activation after its consumers ran: the two largest outputs bound the live set.

Optimizer step: the activations are freed, every gradient is alive, and torch's default multi-tensor (foreach)
Adam/AdamW allocates one state-sized temporary per parameter (sqrt(v) + eps for all of them at once;
`OPTIMIZER_TEMPORARIES`; SGD with momentum updates in place). When those temporaries exceed the activations' share
the step is the peak: `temporaries_bytes` holds them and `activations_bytes` is 0 (a large model at a small batch:
Transformer-XL large with its 520M parameters at batch 1). A fused step (`JobSpec.fused_optimizer`: torch's
fused=True, apex's, DeepSpeed's) allocates none; the per-parameter Adam of torch < 2.0 and the CPU's default (no
foreach) allocate one parameter's worth at a time (not counted).

Not counted: the activation gradients backward holds while it runs an op (an op-dependent transient: cat's
backward is views, linear's allocates its input's gradient), the CUDA context (`CONTEXT_RESERVE_BYTES`, taken off
the capacity), data a training script keeps on the device besides the batch (DLE's NCF keeps its data set on the
GPU). The estimate is therefore slightly optimistic where a job runs close to the device's limit.

Activations scale linearly with the batch: a micro-batch of `micro_batch_size` samples holds
`activations x micro_batch_size / spec.batch_size`. Without pipeline parallelism one micro-batch is live at a time
(gradient accumulation).

Placement shard
---------------
- `tensor_parallel = t`: weights, gradients, optimizer state and activations / t (Megatron layers with sequence
  parallelism, which shards the layer-boundary activations too; without it about 10·s·b·h bytes per layer stay
  replicated, so this is a lower bound there).
- `pipeline_parallel = p`: each stage holds 1/p of the layers: weights, gradients, optimizer / p. Activations: the
  FIRST stage is the worst one: under the 1F1B schedule it keeps up to p micro-batches in flight (min(p, number of
  micro-batches)), each holding 1/p of the layers' activations: activations(micro-batch) x min(p, m) / p.
- `zero_stage` over `data_parallel = d` ranks: ZeRO-1 shards optimizer state (/d), ZeRO-2 also gradients, ZeRO-3
  (FSDP) also weights, which are all-gathered one layer at a time: weights = min(W, W/d + largest layer's weights).
  Each stage therefore never increases per-device memory.
- `expert_parallel = e` (mixture of experts, `Graph.moe`): each device holds 1/e of every MoE layer's experts,
  so the experts' parameter elements (`MoEInfo.expert_params`) count / e in weights, gradients and optimizer
  state. Expert parallelism is carved out of data parallelism (Megatron-Core, DeepSpeed-MoE): a device's experts
  are replicated over dp / e ranks only, which is the group ZeRO shards them over (/ max(1, dp // e)); the other
  parameters shard over dp as above. Activations are unchanged (balanced routing: the all-to-all brings a device
  as many token rows as it sends). ZeRO-3's gathered layer still counts all of its experts (an upper bound).
- `activation_checkpointing`: only each layer's output (its last node's outputs) is kept, and one layer at a time
  is recomputed in backward: activations = boundary outputs + the largest layer's activations (capped at the
  un-checkpointed figure). A "layer" is a maximal run of consecutive nodes owned by the same repeated block: the
  module path up to its last numeric component (`model.layers.3`, `stages.2.blocks.0`), else its first component
  (`Mixed_5b`). This ignores tensors a layer saves that are not its output (e.g. a residual stream read later) and
  the recompute's own backward temporaries.

Data parallelism (`data_parallel > 1` without ZeRO): torch's DistributedDataParallel all-reduces through buckets
that hold a copy of every gradient for the whole run (`gradient_as_bucket_view=False`, its default, kept by
transformers' Trainer, Lightning and Accelerate): with `gradient_bucket_copy` (`Parallelism.gradient_bucket_copy`)
`gradient_buckets_bytes` = the gradients' bytes. Without it (the default) the buckets are the gradients: torch DDP
with `gradient_as_bucket_view=True`, apex's DDP (NVIDIA's DeepLearningExamples: it flattens one bucket at a time
while it all-reduces), Megatron-LM's and DeepSpeed's data parallelism. The default is the leaner one because a
placement should not be refused for a copy the job may not keep: NVIDIA's BERT-large SQuAD fine-tuning in fp32 at
batch 16, as Lambda's GPU benchmark runs it on 1-8 GPUs of 24 GB, goes through apex's DDP, where the copy (1.2 GiB)
would put it 4 MiB over. ZeRO and FSDP reduce-scatter through their own buffers (not counted), and `bf16-master`'s
fp32 gradients are themselves the buffer all-reduced (Megatron-LM's).

Workspace: `WORKSPACE_FRACTION` of the rest (allocator fragmentation, library workspaces).

Checked against Lambda's benchmark runs (`bench/memory_fit.py`): all 1,986 runs that ran are called fitting, and
the 34 Transformer-XL large out-of-memory runs unfit; the 8 other out-of-memory runs contradict runs that ran
(a larger batch of the same model on a device of the same size, or the same job).

`fits(estimate, hardware)` compares `peak_bytes` with `usable_memory_bytes(hardware)`: the device's memory in bytes
(`memory_gb` binary GB, as spec sheets count it: an "80GB" A100 holds 81,920 MiB) less `CONTEXT_RESERVE_BYTES`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodel.core.ir import Graph, MoEInfo, Node, TensorMeta
from perfmodel.core.opkinds import OpKind
from perfmodel.graph.flops import DTYPE_BYTES
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import JobSpec, Mode, OptimizerName, Precision

# optimizer state tensors per parameter: SGD momentum buffer; Adam/AdamW first and second moments
OPTIMIZER_STATES = {OptimizerName.sgd: 1, OptimizerName.adam: 2, OptimizerName.adamw: 2}
# state-sized buffers the optimizer step allocates per parameter: torch's default multi-tensor (foreach) Adam/AdamW
# builds sqrt(v) + eps for every parameter at once (`_multi_tensor_adam`); SGD with momentum updates in place
OPTIMIZER_TEMPORARIES = {OptimizerName.sgd: 0, OptimizerName.adam: 1, OptimizerName.adamw: 1}
WORKSPACE_FRACTION = 0.05  # allocator fragmentation and library workspaces, of the rest
# what a process takes on the device before its first tensor: the CUDA/ROCm context with the kernels of cuDNN,
# cuBLAS and torch loaded (0.3-0.5 GiB with CUDA's lazy loading, 11.7 on; up to about 1 GiB before it, as the
# public runs' 10.x-11.x containers load them). The same on an 8 GB laptop part as on an 80 GB A100: not a share.
CONTEXT_RESERVE_BYTES = 2**30
HALF_BYTES = 2
FP32_BYTES = 4


@dataclass(frozen=True)
class BytesPerParam:
    weights: int
    gradients: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer


def bytes_per_param(precision: Precision, optimizer: OptimizerName, mode: Mode = Mode.train) -> BytesPerParam:
    """Bytes each parameter costs (see the module docstring's table)."""
    states = OPTIMIZER_STATES[optimizer]
    if mode == Mode.inference:
        return BytesPerParam(HALF_BYTES if precision.half_weights else FP32_BYTES, 0, 0)
    if precision.half_state:
        return BytesPerParam(HALF_BYTES, HALF_BYTES, states * HALF_BYTES)
    gradients = FP32_BYTES if precision.fp32_gradients else HALF_BYTES
    if precision.autocast or precision.master_weights:
        return BytesPerParam(HALF_BYTES, gradients, FP32_BYTES + states * FP32_BYTES)  # fp32 master + states
    return BytesPerParam(FP32_BYTES, FP32_BYTES, states * FP32_BYTES)  # fp32, fp32-strict, tf32


def optimizer_temporary_bytes(precision: Precision, optimizer: OptimizerName, fused: bool = False) -> int:
    """Bytes per parameter the optimizer step allocates and frees (`OPTIMIZER_TEMPORARIES` state-sized buffers,
    none for a `fused` step, which computes each element's update in registers; and a master-weight step's fp32
    copy of half gradients)."""
    copies = 1 if precision.master_weights and not precision.fp32_gradients else 0
    buffers = (0 if fused else OPTIMIZER_TEMPORARIES[optimizer]) + copies
    return buffers * (HALF_BYTES if precision.half_state else FP32_BYTES)


@dataclass(frozen=True)
class MemoryEstimate:
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    workspace_bytes: int
    # the optimizer step's temporaries, when the step is the peak (its activations are all freed then)
    temporaries_bytes: int = 0
    # data parallelism's all-reduce buckets (DistributedDataParallel's own copy of the gradients)
    gradient_buckets_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.temporaries_bytes + self.gradient_buckets_bytes + self.workspace_bytes)


def _tensor_bytes(t: TensorMeta, precision: Precision) -> int:
    if precision.autocast and t.dtype == "float32":
        return t.numel * HALF_BYTES
    return t.numel * DTYPE_BYTES.get(t.dtype, 4)


def _output_bytes(node: Node, precision: Precision) -> int:
    return sum(_tensor_bytes(t, precision) for t in node.output_tensors)


def layer_key(module: str | None) -> str | None:
    """The repeated block owning a module path: up to its last numeric component, else its first component."""
    if not module:
        return None
    parts = module.split(".")
    numeric = [i for i, part in enumerate(parts) if part.isdigit()]
    return ".".join(parts[: numeric[-1] + 1]) if numeric else parts[0]


def layers(graph: Graph) -> list[list[Node]]:
    """Maximal runs of consecutive nodes with the same `layer_key` (nodes without a module join the run before)."""
    runs: list[list[Node]] = []
    current: str | None = None
    for node in graph.nodes:
        key = layer_key(node.module)
        if runs and (key is None or key == current):
            runs[-1].append(node)
            continue
        runs.append([node])
        current = key
    return runs


@dataclass(frozen=True)
class ActivationProfile:
    """Training activations at the graph's batch: everything kept, the layers' outputs, the largest layer."""
    full_bytes: int
    boundary_bytes: int
    largest_layer_bytes: int

    @property
    def checkpointed_bytes(self) -> int:
        return min(self.full_bytes, self.boundary_bytes + self.largest_layer_bytes)


def saved_bytes(graph: Graph, precision: Precision) -> int | None:
    """What autograd saves in one training forward of the graph's batch, as measured at capture
    (`GraphTotals.saved_activation_bytes`, its autocast twin under amp); None if the graph has no measurement."""
    totals = graph.totals
    measured = totals.saved_activation_bytes_amp if precision.autocast else totals.saved_activation_bytes
    return None if measured is None else int(measured)


@dataclass(frozen=True)
class GraphBytes:
    """What memory estimates read of a graph at one precision, as arrays over its nodes: the graph is walked once
    (`of`), everything after is arithmetic. Every array is affine in the batch where the graph is
    (`perfmodel.graph.batch_affine`), so two of them fix the one at any batch (`between`)."""

    output_bytes: np.ndarray  # int64: each node's outputs at the precision (`_output_bytes`)
    view: np.ndarray  # bool: view nodes (no storage of their own)
    params: np.ndarray  # int64: parameter elements each node reads
    run_of: np.ndarray  # intp: the layer run (`layers`) of each node
    block_last: np.ndarray  # intp: the last node of each run owned by a repeated block (`block_outputs`)
    params_total: int
    saved: int | None  # what autograd saves (measured at capture), None where the graph has no measurement
    largest_layer_params: int
    moe: MoEInfo | None = None  # its experts (memory reads only their count and parameters, not the batch's)

    @classmethod
    def of(cls, graph: Graph, precision: Precision) -> GraphBytes:
        nodes = list(graph.nodes)
        run_of, block_last = [], []
        for r, run in enumerate(layers(graph)):
            run_of.extend([r] * len(run))
            key = layer_key(run[0].module)
            if key and any(part.isdigit() for part in key.split(".")):
                block_last.append(len(run_of) - 1)
        return cls(output_bytes=np.array([_output_bytes(n, precision) for n in nodes], dtype=np.int64),
                   view=np.array([n.kind == OpKind.view for n in nodes], dtype=bool),
                   params=np.array([n.params for n in nodes], dtype=np.int64),
                   run_of=np.array(run_of, dtype=np.intp), block_last=np.array(block_last, dtype=np.intp),
                   params_total=graph.totals.params, saved=saved_bytes(graph, precision),
                   largest_layer_params=largest_layer_params(graph), moe=getattr(graph, "moe", None))

    def between(self, other: GraphBytes, batch: float, batch_other: float, at: float) -> GraphBytes:
        """The arrays at batch `at` on the line through this one (at `batch`) and `other` (at `batch_other`)."""
        def line(a: np.ndarray | int | None, b: np.ndarray | int | None) -> Any:
            if a is None or b is None:
                return None
            value = np.maximum(np.rint(a + (np.asarray(b) - a) * ((at - batch) / (batch_other - batch))), 0)
            return value.astype(np.int64) if isinstance(value, np.ndarray) and value.ndim else int(value)

        return GraphBytes(output_bytes=line(self.output_bytes, other.output_bytes), view=self.view,
                          params=self.params, run_of=self.run_of, block_last=self.block_last,
                          params_total=self.params_total, saved=line(self.saved, other.saved),
                          largest_layer_params=self.largest_layer_params, moe=self.moe)

    def same_structure(self, other: GraphBytes) -> bool:
        return (len(self.view) == len(other.view) and bool((self.view == other.view).all())
                and bool((self.run_of == other.run_of).all()) and bool((self.params == other.params).all())
                and np.array_equal(self.block_last, other.block_last) and (self.saved is None) == (other.saved is None))

    @property
    def kept_outputs(self) -> int:
        return int(self.output_bytes[~self.view].sum())

    def block_outputs(self) -> list[int]:
        """Output bytes of each repeated block, in order (`perfmodel.predictor.placed.block_outputs`)."""
        return [int(v) for v in self.output_bytes[self.block_last]]


def activation_profile(graph: Graph | GraphBytes, precision: Precision) -> ActivationProfile:
    """The graph's activations: every kept output (the rule), or what autograd saves when the graph measured it;
    the largest layer then scales by the same ratio (the layer outputs checkpointing keeps are real tensors)."""
    b = graph if isinstance(graph, GraphBytes) else GraphBytes.of(graph, precision)
    kept = ~b.view
    runs = b.run_of[kept]
    per_run = np.bincount(runs, weights=b.output_bytes[kept]) if len(runs) else np.zeros(0)
    outputs = b.kept_outputs
    largest = int(per_run.max()) if len(per_run) else 0
    last_kept = np.flatnonzero(np.r_[runs[1:] != runs[:-1], True]) if len(runs) else np.zeros(0, dtype=np.intp)
    measured = b.saved
    ratio = measured / outputs if measured is not None and outputs else 1.0
    return ActivationProfile(
        full_bytes=measured if measured is not None else outputs,
        boundary_bytes=int(b.output_bytes[kept][last_kept].sum()),
        largest_layer_bytes=math.ceil(largest * ratio),
    )


def inference_activation_bytes(graph: Graph | GraphBytes, precision: Precision) -> int:
    """The two largest outputs: an inference step frees each activation once its consumers ran."""
    b = graph if isinstance(graph, GraphBytes) else GraphBytes.of(graph, precision)
    return int(np.sort(b.output_bytes)[::-1][:2].sum())


def backward_overlap_bytes(graph: Graph | GraphBytes, precision: Precision, activation_scale: float,
                           gradients: int) -> int:
    """The activations' share of the step's peak of activations + gradients (see the module docstring).

    Backward walks the nodes in reverse: when it reaches node i, the saved activations of nodes <= i are alive and
    the gradients of the parameters of nodes >= i exist. Per-node activations are the nodes' outputs scaled by
    `activation_scale` (the shard's stored activations / the graph's outputs), per-node gradients so they sum to
    `gradients`; the result is max_i(activations <= i + gradients >= i) - gradients, in [0, scaled activations]."""
    b = graph if isinstance(graph, GraphBytes) else GraphBytes.of(graph, precision)
    total_params = int(b.params.sum())
    grad_per_param = gradients / total_params if total_params else 0.0
    prefix = np.cumsum(np.where(b.view, 0.0, b.output_bytes * activation_scale))
    # a tied weight is read by several nodes: never more gradient than the model has
    before = np.maximum(0.0, gradients - np.r_[0.0, np.cumsum(b.params * grad_per_param)[:-1]])
    peak = max(float(gradients), float((prefix + np.minimum(float(gradients), before)).max(initial=0.0)))
    return math.ceil(peak - gradients)


def largest_layer_params(graph: Graph) -> int:
    """Parameter elements read by the largest layer (an upper bound per layer: a tied weight counts in each)."""
    return max((sum(n.params for n in run) for run in layers(graph)), default=0)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def estimate_memory(spec: JobSpec, graph: Graph | GraphBytes, *, tensor_parallel: int = 1, pipeline_parallel: int = 1,
                    data_parallel: int = 1, zero_stage: int = 0, activation_checkpointing: bool = False,
                    micro_batch_size: int | None = None, micro_batches: int | None = None,
                    expert_parallel: int = 1, gradient_bucket_copy: bool = False) -> MemoryEstimate:
    """Peak memory of the worst device of a placement shard (the defaults: the whole job on one device).
    `gradient_bucket_copy`: data parallelism keeps a bucket copy of the gradients (torch DDP's default).

    `micro_batches`, when given, is the number of micro-batches per iteration and `spec`/`graph` are one
    micro-batch (the placement model captures graphs at the micro-batch size); otherwise `spec.batch_size` is the
    replica's batch, split into micro-batches of `micro_batch_size`. `expert_parallel` > 1 needs a graph with
    MoE layers (`graph.moe`) whose experts it divides. `graph` may be its `GraphBytes` at the spec's precision
    (walked once for many placements, or made for another batch)."""
    _check_positive(tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel,
                    data_parallel=data_parallel, expert_parallel=expert_parallel)
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
    micro = spec.batch_size if micro_batch_size is None else min(micro_batch_size, spec.batch_size)
    _check_positive(micro_batch_size=micro)
    tp, pp, dp, ep = tensor_parallel, pipeline_parallel, data_parallel, expert_parallel
    per_param = bytes_per_param(spec.precision, spec.optimizer, spec.mode)
    b = graph if isinstance(graph, GraphBytes) else GraphBytes.of(graph, spec.precision)
    params = b.params_total
    model_split = tp * pp
    experts = _expert_params(b, ep)  # 0 without expert parallelism: the formulas below are the dense ones
    dense = params - experts
    expert_dp = max(1, dp // ep)  # the ranks holding the same experts (ZeRO's group for them)

    def shard(bytes_per: int, zero: bool) -> int:
        """Bytes of `bytes_per` per parameter on one device: / (tp pp), experts / ep, ZeRO-sharded if `zero`."""
        dense_bytes = dense * bytes_per / model_split / (dp if zero else 1)
        if not experts:
            return math.ceil(dense_bytes)
        return math.ceil(dense_bytes + experts * bytes_per / model_split / ep / (expert_dp if zero else 1))

    # weights: / (tp pp); ZeRO-3 also / dp, plus one all-gathered layer (never more than unsharded)
    weights_full = shard(per_param.weights, zero=False)
    weights = weights_full
    if zero_stage >= 3:
        gathered = math.ceil(b.largest_layer_params * per_param.weights / tp)
        sharded = math.ceil(weights_full / dp) if not experts else shard(per_param.weights, zero=True)
        weights = min(weights_full, sharded + gathered)
    gradients = shard(per_param.gradients, zero=zero_stage >= 2)
    optimizer = shard(per_param.optimizer, zero=zero_stage >= 1)

    scale = micro / spec.batch_size  # activations of one micro-batch, of the graph's batch
    if spec.mode == Mode.train:
        acts = activation_profile(b, spec.precision)
        per_iteration = micro_batches if micro_batches is not None else math.ceil(spec.batch_size / micro)
        in_flight = min(pp, per_iteration)  # 1F1B: the first stage's micro-batches
        stored = acts.full_bytes * scale * in_flight / pp
        if activation_checkpointing:  # layer outputs of every micro-batch in flight + one layer recomputed
            stored = min(stored, (acts.boundary_bytes * in_flight / pp + acts.largest_layer_bytes) * scale)
        outputs = b.kept_outputs
        activations = backward_overlap_bytes(b, spec.precision, stored / tp / outputs if outputs else 0.0,
                                             gradients)
        # the optimizer step: activations freed, every gradient alive, its temporaries sharded like its state
        temporaries = shard(optimizer_temporary_bytes(spec.precision, spec.optimizer, spec.fused_optimizer),
                            zero=zero_stage >= 1)
        if temporaries > activations:
            activations = 0
        else:
            temporaries = 0
    else:
        activations, temporaries = math.ceil(inference_activation_bytes(b, spec.precision) * scale / tp), 0
    # torch's DistributedDataParallel, asked for (`gradient_bucket_copy`), all-reduces gradients through buckets of
    # its own, as large as the gradients together and alive the whole run (`gradient_as_bucket_view=False`, its
    # default); ZeRO and FSDP reduce-scatter through buffers of their own instead (not counted), and fp32 gradient
    # buffers are themselves what is all-reduced (Megatron-LM's contiguous `main_grad`)
    buckets = (gradients if gradient_bucket_copy and spec.mode == Mode.train and dp > 1 and zero_stage == 0
               and not spec.precision.fp32_gradients else 0)
    rest = weights + gradients + optimizer + activations + temporaries + buckets
    return MemoryEstimate(weights, gradients, optimizer, activations, int(rest * WORKSPACE_FRACTION), temporaries,
                          buckets)


def _expert_params(graph: Graph | GraphBytes, expert_parallel: int) -> int:
    """The experts' parameter elements that expert parallelism divides (0 when it is 1)."""
    if expert_parallel == 1:
        return 0
    moe = getattr(graph, "moe", None)
    if moe is None:
        raise ValueError(f"expert_parallel {expert_parallel} needs a mixture-of-experts graph (graph.moe is None)")
    if moe.experts % expert_parallel:
        raise ValueError(f"expert_parallel {expert_parallel} does not divide the {moe.experts} experts per layer")
    return moe.expert_params


def usable_memory_bytes(hardware: HardwareSpec) -> int:
    """Memory a job may use on one device of `hardware`: its memory less the context's (`CONTEXT_RESERVE_BYTES`)."""
    return max(0, hardware.memory_bytes - CONTEXT_RESERVE_BYTES)


def shared_capacity_bytes(capacity: int, processes: int) -> int:
    """What `processes` jobs sharing one device (co-located, each its own process) may use together, of one job's
    `capacity` (`usable_memory_bytes`): each further process holds a CUDA context of its own."""
    return max(0, capacity - (processes - 1) * CONTEXT_RESERVE_BYTES)


def fits(estimate: MemoryEstimate, hardware: HardwareSpec) -> bool:
    """Whether the estimate's peak fits in the memory a job may use on the device (`usable_memory_bytes`)."""
    return estimate.peak_bytes <= usable_memory_bytes(hardware)

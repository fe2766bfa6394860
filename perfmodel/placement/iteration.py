"""The iteration time of a job on a placement, as an explicit sum, vectorised over (job, placement) pairs.

Inputs: a job's *compute* on one device of the accelerator (`ShardCompute`: forward, backward, optimizer and
overhead of one micro-batch of the whole model, from the predictors of the earlier issues or from a measured
profile), the placement (`PlacementArrays`: degrees, micro-batches, how each parallel group sits on nodes, the two
links' α and β) and a few fitted constants (`IterationParams`). With t, p, d, e the tensor, pipeline, data and
expert degrees, m micro-batches, and T = 1 when training, 0 for inference:

    stage time of one micro-batch  s = (fwd + bwd + recompute) / (t·p) · (1 + tp_penalty·(t-1))
                                       + tensor-parallel all-reduces of its layers ((2 + 2T) per layer)
                                       + expert-parallel all-to-alls of its MoE layers ((2 + 2T) per layer, e > 1)
                                       + layer_overhead · layers / p      (host cost per block, any batch)
                                       + host exposed: max(0, host issue time of the stage's kernels
                                         - its device time)     (eager PyTorch's dispatch, see below)
    compute                        = m · s                                  (every micro-batch through a stage)
    pipeline_bubble                = (p-1) · s                              (1F1B fill and drain)
    pipeline send/recv             = (1 + T) · (m + p - 2) · send(layer activation / t)          (p > 1)
    data-parallel (T = 1, d > 1)   ZeRO-0   max(AR(G) - h_b, AR(bucket))                  once per iteration
                                   ZeRO-1/2 max(RS(G) - h_b, RS(bucket)) + AG(G)          gradients reduce-scattered
                                                                                          under backward, updated
                                                                                          parameters all-gathered
                                                                                          after the step (exposed)
                                   ZeRO-3   m · [max(AG(G) - h_f, AG(bucket))             forward parameter gather
                                                 + max(AG(G) + RS(G) - h_b,               backward gather + gradient
                                                       AG(bucket) + RS(bucket))]          reduce-scatter, every
                                                                                          micro-batch
    data-parallel wait (T=1, d > 1) = jitter · E[max of d standard normals] · m · (fwd + bwd + recompute) / (t·p)
                                     synchronous data parallelism waits every step for its slowest replica: a
                                     replica's compute varies from step to step by the jitter (relative standard
                                     deviation), and the slowest of d is E[max] (Blom's approximation) standard
                                     deviations above the mean; the wait shows up in the gradient all-reduce.
                                     The jitter is the job's kind's (`replica_jitter`): `dp_jitter_varying` for
                                     steps that vary (variable-length batches, inputs decoded on the host),
                                     `dp_jitter_steady` for steps that do not, `dp_jitter` when not known
    optimizer (T = 1)              = O/(t·p) · (share of the parameters a rank steps: 1/d with ZeRO >= 1, else
                                     dense + experts/e), never below O/(t·p) - (data- and expert-parallel
                                     communication): a rank's step never saves more than its sharding costs

The optimizer floor is what makes "n devices never more than n times one device's throughput" hold for every
ZeRO stage: without it, a sharded step (O/d) plus cheap, well-hidden collectives would beat one device running the
whole step. It is a modelling choice, not a measurement: where the unsharded step costs more than the sharding's
communication (bert-large with Adam on 8 H100s: 9.4 ms step, 2.3 ms exposed ZeRO-1 gather) it credits ZeRO with
less than the sharded step would save.
    overhead                       = m · (layer_overhead · layers / p + host exposed) + overhead_ms
                                     (+ multi_device_overhead_ms if distributed)

    iteration = compute + pipeline_bubble + communication + optimizer + overhead,
    communication = tensor-parallel + expert-parallel + pipeline + data-parallel + data-parallel wait.

G is the gradient bytes of a rank's shard (params · grad bytes / (t·p)); the ZeRO parameter all-gathers move the
same bytes (the working parameters and the gradients share a dtype). h_b = overlap · (backward + recompute of a
micro-batch stage): DDP buckets all-reduce while backward still runs, all but what backward cannot hide is
overlapped, and the last bucket never is: at least 25 MB (PyTorch's default cap), more where the model's first
parameters are large (an input embedding: `ddp_last_bucket_bytes`); h_f = overlap · forward (ZeRO-3 prefetch).
`overlap` is the fitted `dp_overlap`, times comm.NO_P2P_OVERLAP_SCALE on GPUs without peer-to-peer.
ZeRO-3 communication is never less than ZeRO-0's (AG + RS = AR for rings), nor is ZeRO-1/2's.

Mixture of experts (e > 1): an MoE layer sends each rank's routed tokens (tokens · top_k · hidden · bytes / t)
to the experts' ranks and back: two all-to-alls in forward, two in backward, each moving (e-1)/e of the buffer
per rank. Expert gradients (expert params / e per rank) are reduced over the d/e ranks holding the same experts,
the dense ones over all d. e = 1 is the dense model exactly.

Placement: every collective runs on a group of ranks (Megatron's order: tensor innermost, then data, pipeline
outermost) that spans `*_nodes` nodes. A group spanning n > 1 nodes runs hierarchically: intra-node phase(s) on
its g = ranks/n members of each node, and the inter-node ring of each node's shards over that node's network,
which all the node's groups of that kind share (the network β is the node's, `comm.node_network_link`). On GPUs
without P2P (`host_staged`) the intra-node β is shared by the node's devices (`comm.host_shared_beta`). Every
collective, and the pipeline's sends, costs at least what it costs with all the placement's devices in one node:
a spread placement has every link the consolidated one has, or a slower one, so it is never faster.

Every function takes numpy arrays of equal length (one entry per (job, placement) pair), so a batch of ten
thousand pairs is a handful of array operations (`bench/placement_batch.py`); plain floats evaluate one pair.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path
from statistics import NormalDist
from typing import Any, NamedTuple

import numpy as np

from perfmodel.core import cost
from perfmodel.placement.comm import NO_P2P_OVERLAP_SCALE

PARAMS_FILE = "iteration_params.json"
DDP_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default bucket_cap_mb = 25
DDP_FIRST_BUCKET_BYTES = 2**20  # DDP's first bucket (the last layers' gradients, ready first) is 1 MiB
TP_ALLREDUCES_FORWARD = 2  # Megatron: attention and MLP outputs in forward, as many in backward
TP_ALLREDUCES_RECOMPUTE = 2  # the recomputed forward's
MOE_ALL_TO_ALLS_FORWARD = 2  # dispatch and combine in forward, as many in backward


@dataclass(frozen=True)
class ShardCompute:
    """One job's compute on one device of an accelerator, for one micro-batch of the whole model (t = p = 1)."""

    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    overhead_ms: float
    params: int
    gradient_bytes_per_param: int
    layers: int  # repeated blocks the model is split over (pipeline stages, tensor-parallel all-reduces)
    layer_activation_bytes: int  # one block's output for the micro-batch (what TP all-reduces and PP sends)
    moe_layers: int = 0  # mixture-of-experts layers (0: dense)
    moe_dispatch_bytes: int = 0  # tokens x top_k x hidden x bytes of the micro-batch: one all-to-all's buffer
    expert_params: int = 0  # parameters of all experts of all MoE layers (split over expert-parallel ranks)
    host_forward_ms: float = 0.0  # host time to issue the forward's kernels (eager PyTorch), whatever t and p
    host_backward_ms: float = 0.0  # and the backward's
    # gradient bytes DDP all-reduces after backward ends: its last buckets, which hold the model's first parameters
    # (`ddp_last_bucket_bytes`); 0: not known (a bucket of DDP_BUCKET_BYTES)
    last_bucket_bytes: float = 0.0
    # whether the job's steps vary from replica to replica (`JobSpec.steps_vary`): 1 they do, 0 they do not, -1 not
    # known; it picks the replica jitter (`replica_jitter`)
    steps_vary: float = -1.0


def ddp_last_bucket_bytes(params_in_forward_order: Sequence[int], gradient_bytes_per_param: int) -> int:
    """The gradient bytes DistributedDataParallel all-reduces after backward ends. DDP fills buckets in reverse
    parameter order (the order backward produces gradients), closing one as soon as it holds at least its cap (1 MiB
    for the first, 25 MiB after), the tensor that crosses the cap included. The last bucket holds the model's first
    parameters, and the closed bucket before it is ready only once the first layers' backward (little work) remains:
    both all-reduce after backward ends. A large input embedding (a language model's vocabulary, a recommender's
    tables) makes that tail far larger than the cap. `params_in_forward_order`: parameter elements of each graph
    node in execution order (a node's parameters taken as one tensor)."""
    filled, last, cap = 0, 0, DDP_FIRST_BUCKET_BYTES
    for count in reversed(params_in_forward_order):
        if count <= 0:
            continue
        filled += int(count) * gradient_bytes_per_param
        if filled >= cap:
            last, filled, cap = filled, 0, DDP_BUCKET_BYTES
    return last + filled


@dataclass(frozen=True)
class IterationParams:
    """The constants the placement measurements determine (`fit` in perfmodel.evaluation.placement)."""

    dp_overlap: float = 0.5  # fraction of the last backward that hides the gradient all-reduce
    overhead_ms: float = 0.0  # per-iteration framework cost (data loading, Python, launch gaps)
    multi_device_overhead_ms: float = 0.0  # per-iteration cost of any distributed run (DDP hooks, syncs)
    tp_penalty: float = 0.0  # compute inefficiency per extra tensor-parallel rank (smaller GEMMs)
    tp_sync_ms: float = 0.0  # per tensor-parallel all-reduce, beyond α-β: the wait for the slowest rank
    dp_jitter: float = 0.0  # relative step-to-step spread of a replica's compute (data parallelism waits for the
    # slowest replica every step), for a job whose kind is not known
    dp_jitter_steady: float | None = None  # the same for steps that do not vary (fixed shapes, input ready on the
    # device); None: dp_jitter
    dp_jitter_varying: float | None = None  # for steps that do (variable-length batches, inputs decoded on the
    # host); None: dp_jitter
    layer_overhead_ms: float = 0.0  # host-side cost per block per micro-batch (Python, launches), any batch size
    compute_scale: float = 1.0  # calibration of the compute predictor for the data it was fitted on
    # p10 and p90 of log(measured / predicted) of the n-device / 1-device step ratio on real multi-device runs (the
    # placement model's own error): multi-device intervals add it to one device's band in quadrature
    scaling_band_log: tuple[float, float] = (0.0, 0.0)
    source: str = "defaults"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IterationParams:
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        if "scaling_band_log" in values:
            values["scaling_band_log"] = tuple(float(v) for v in values["scaling_band_log"])
        return cls(**values)


def params_path() -> Path:
    return Path(str(resources.files("perfmodel.placement").joinpath(PARAMS_FILE)))


def load_params(name: str = "default", path: Path | str | None = None) -> IterationParams:
    """The fitted `IterationParams` stored under `name` (params_path(); written by bench/placement_fit.py)."""
    file = Path(path) if path else params_path()
    if not file.exists():
        return IterationParams()
    table = json.loads(file.read_text())["params"]
    if name not in table:
        raise KeyError(f"no iteration parameters named {name!r} in {file}; have {sorted(table)}")
    return IterationParams.from_dict(table[name])


def dump_params(table: dict[str, IterationParams | dict[str, Any]]) -> str:
    return json.dumps({"schema_version": 1, "params": {k: v if isinstance(v, dict) else asdict(v)
                                                       for k, v in table.items()}}, indent=2) + "\n"


# --- the vectorised model -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ComputeArrays:
    """`ShardCompute` fields as arrays (one entry per pair, or shapes that broadcast with the placement's), or as
    floats for a single pair."""

    forward_ms: np.ndarray | float
    backward_ms: np.ndarray | float
    optimizer_ms: np.ndarray | float
    overhead_ms: np.ndarray | float
    params: np.ndarray | float
    gradient_bytes_per_param: np.ndarray | float
    layers: np.ndarray | float
    layer_activation_bytes: np.ndarray | float
    moe_layers: np.ndarray | float = 0.0
    moe_dispatch_bytes: np.ndarray | float = 0.0
    expert_params: np.ndarray | float = 0.0
    host_forward_ms: np.ndarray | float = 0.0
    host_backward_ms: np.ndarray | float = 0.0
    last_bucket_bytes: np.ndarray | float = 0.0
    steps_vary: np.ndarray | float = -1.0

    @classmethod
    def stack(cls, computes: list[ShardCompute]) -> ComputeArrays:
        return cls(**{f.name: np.array([getattr(c, f.name) for c in computes], dtype=float) for f in fields(cls)})


@dataclass(frozen=True)
class PlacementArrays:
    """A placement as arrays (one entry per pair, or broadcast), or floats for a single pair: degrees,
    micro-batches, where the parallel groups sit, the links' α, β.

    The intra β is one transfer's alone (on GPUs without P2P, `host_staged` = 1, the node's devices share it); the
    inter β is the node's whole usable network (`comm.node_network_link`). `node_devices` is the devices on a
    node (0: unknown; every group then has its nodes' network to itself). The new fields default to one node."""

    tensor: np.ndarray | float
    pipeline: np.ndarray | float
    data: np.ndarray | float
    micro_batches: np.ndarray | float
    zero_stage: np.ndarray | float
    checkpointing: np.ndarray | float  # 0/1
    nodes: np.ndarray | float  # nodes a data-parallel group spans
    intra_alpha_ms: np.ndarray | float
    intra_beta_ms_per_byte: np.ndarray | float
    inter_alpha_ms: np.ndarray | float
    inter_beta_ms_per_byte: np.ndarray | float
    expert: np.ndarray | float = 1.0  # expert-parallel degree (divides data)
    tensor_nodes: np.ndarray | float = 1.0  # nodes a tensor-parallel group spans
    expert_nodes: np.ndarray | float = 1.0  # nodes an expert-parallel group spans
    expert_data_nodes: np.ndarray | float = 1.0  # nodes the d/e ranks holding the same experts span
    pipeline_nodes: np.ndarray | float = 1.0  # nodes the pipeline spans (> 1: stage sends cross the network)
    node_devices: np.ndarray | float = 0.0  # devices on the fullest node (0: unknown)
    host_staged: np.ndarray | float = 0.0  # 1: no GPU peer-to-peer, intra-node transfers go through host memory

    @classmethod
    def of_floats(cls, values: Sequence[float]) -> PlacementArrays:
        """One pair from every field's value in order (`predictor.placed.placement_row`), made without the frozen
        dataclass's per-field `object.__setattr__` (0.5 us instead of 1.9: a single prediction's hot path)."""
        if len(values) != len(_PLACEMENT_FIELDS):
            raise ValueError(f"{len(values)} values for the {len(_PLACEMENT_FIELDS)} fields of PlacementArrays")
        made = object.__new__(cls)
        made.__dict__.update(zip(_PLACEMENT_FIELDS, values))
        return made


_PLACEMENT_FIELDS = tuple(f.name for f in fields(PlacementArrays))


# The model is written once for arrays (many pairs) and plain floats (one pair: no numpy call overhead, ~10× faster
# for a single prediction). Arithmetic works on both; `_where`, `_when` and core.cost's maximum / minimum (which the
# cost formulas use too) are the only functions it needs.
def _where(condition: Any, yes: Any, no: Any) -> Any:
    if condition.__class__ is bool:  # one pair (checked first: the float path is the one that counts microseconds)
        return yes if condition else no
    return np.where(condition, yes, no) if isinstance(condition, np.ndarray) else (yes if condition else no)


_maximum = cost.maximum
_minimum = cost.minimum


def _when(condition: Any, price: Any) -> Any:
    """`price()` where `condition` holds, else 0; not evaluated at all where it holds nowhere (one pair, or a batch
    with no such pair)."""
    if condition.__class__ is bool:
        return price() if condition else 0.0
    if isinstance(condition, np.ndarray):
        return np.where(condition, price(), 0.0) if condition.any() else 0.0
    return price() if condition else 0.0


class _Group(NamedTuple):
    """How a group of `ranks` ranks sits: n nodes of g members, `share` groups of its kind on a node sharing the
    node's network, the intra-node β on the layout and with every device in one node. (A tuple: one pair's
    evaluation builds a few of them, and a frozen dataclass costs microseconds each.)"""

    ranks: Any
    n: Any
    g: Any
    share: Any
    beta: Any
    beta_one_node: Any

    @classmethod
    def of(cls, p: PlacementArrays, ranks: Any, nodes: Any) -> _Group:
        n = _minimum(_maximum(nodes, 1.0), ranks)
        g = ranks / n
        node_devices = _where(p.node_devices > 0, _maximum(p.node_devices, g), g)
        devices = p.tensor * p.pipeline * p.data
        return cls(ranks, n, g, node_devices / g,
                   p.intra_beta_ms_per_byte * (1 + p.host_staged * (node_devices - 1)),
                   p.intra_beta_ms_per_byte * (1 + p.host_staged * (devices - 1)))


def _streams(group: _Group) -> Any:
    """Transfers leaving a node at once over its network: one per device of the node (all its groups of this
    kind), or the group's g members when the node's devices are unknown."""
    return group.g * group.share


def _half_ring(p: PlacementArrays, group: _Group, size: Any) -> Any:
    """A ring reduce-scatter (or all-gather) of `size` bytes per rank over `group`; an all-reduce is two of them.
    Across nodes it is hierarchical (the intra-node phase on each node's g members, the inter-node ring of the
    node's shards over its network: `core.cost.hierarchical_reduce_scatter_ms`) and never cheaper than the same
    ranks in one node."""
    spread = cost.hierarchical_reduce_scatter_ms(size, group.ranks, group.n, p.intra_alpha_ms, group.beta,
                                                 p.inter_alpha_ms,
                                                 cost.stream_beta(p.inter_beta_ms_per_byte, _streams(group)))
    one_node = cost.ring_step_ms(group.ranks - 1, size / group.ranks, p.intra_alpha_ms, group.beta_one_node)
    return _maximum(spread, one_node)


def _all_to_all(p: PlacementArrays, group: _Group, size: Any) -> Any:
    """Pairwise all-to-all: each rank sends (ranks-1)/ranks of its `size` bytes. Across nodes, the (n-1)/n that
    leave a node go over its network for every rank on it (`core.cost.hierarchical_all_to_all_ms`); never cheaper
    than the same ranks in one node."""
    spread = cost.hierarchical_all_to_all_ms(size, group.ranks, group.n, p.intra_alpha_ms, group.beta,
                                             p.inter_alpha_ms,
                                             cost.stream_beta(p.inter_beta_ms_per_byte, _streams(group)))
    one_node = cost.ring_step_ms(group.ranks - 1, size / group.ranks, p.intra_alpha_ms, group.beta_one_node)
    return _maximum(spread, one_node)


def _send(p: PlacementArrays, size: Any) -> Any:
    """A pipeline stage's send of `size` bytes: over the network when the pipeline spans nodes (every device of
    a node sending at once), never cheaper than within one node."""
    devices = p.tensor * p.pipeline * p.data
    one_node = cost.send_ms(size, p.intra_alpha_ms, p.intra_beta_ms_per_byte * (1 + p.host_staged * (devices - 1)))
    network = cost.send_ms(size, p.inter_alpha_ms,
                           cost.stream_beta(p.inter_beta_ms_per_byte, _maximum(p.node_devices, 1.0)))
    return _where(p.pipeline_nodes > 1, _maximum(network, one_node), one_node)


_STANDARD_NORMAL = NormalDist()


def expected_max_normal(n: Any) -> Any:
    """E[max of n independent standard normals] by Blom's approximation, Φ⁻¹((n - 0.375) / (n + 0.25)): 0.59 for
    2 (exact 0.56), 1.43 for 8 (exact 1.42), 3.2 for 1,024; 0 for n <= 1. Arrays in, arrays out (one inverse
    per distinct n)."""
    if isinstance(n, np.ndarray):
        values, inverse = np.unique(n, return_inverse=True)
        return np.array([_expected_max(float(v)) for v in values])[inverse].reshape(n.shape)
    return _expected_max(float(n))


@functools.lru_cache(maxsize=4096)
def _expected_max(n: float) -> float:
    return _STANDARD_NORMAL.inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


def steps_vary_code(steps_vary: bool | None) -> float:
    """`JobSpec.steps_vary` as `ShardCompute.steps_vary` codes it: 1 the steps vary, 0 they do not, -1 not known."""
    return -1.0 if steps_vary is None else float(steps_vary)


def replica_jitter(steps_vary: Any, params: IterationParams) -> Any:
    """The replica jitter of jobs whose steps vary (`steps_vary` 1), do not (0) or are not known to (-1): the
    params' `dp_jitter_varying`, `dp_jitter_steady` or `dp_jitter` (either of the first two unset: `dp_jitter`).
    Arrays in, arrays out; a float in, a float out."""
    unknown = params.dp_jitter
    varying = unknown if params.dp_jitter_varying is None else params.dp_jitter_varying
    steady = unknown if params.dp_jitter_steady is None else params.dp_jitter_steady
    if isinstance(steps_vary, np.ndarray):
        return np.where(steps_vary < 0, unknown, np.where(steps_vary > 0, varying, steady))
    if steps_vary < 0:
        return unknown
    return varying if steps_vary > 0 else steady


def iteration_breakdown(c: ComputeArrays, p: PlacementArrays, params: IterationParams) -> dict[str, np.ndarray]:
    """Per-pair components (ms); `iter_time_ms` is their explicit sum. Arrays in, arrays out; floats (one pair)
    in, floats out."""
    t, pp, d, m, e = p.tensor, p.pipeline, p.data, p.micro_batches, p.expert
    train = _where(c.gradient_bytes_per_param > 0, 1.0, 0.0)  # no gradients: inference
    split = t * pp
    scale = params.compute_scale * (1 + params.tp_penalty * (t - 1))
    fwd = c.forward_ms * scale / split
    bwd = c.backward_ms * scale / split
    recompute = fwd * p.checkpointing * train

    layers_per_stage = _maximum(c.layers / pp, 1.0)
    tp_calls = layers_per_stage * (TP_ALLREDUCES_FORWARD * (1 + train) + TP_ALLREDUCES_RECOMPUTE * p.checkpointing
                                   * train)
    tp_ms = _when(t > 1, lambda: tp_calls * (2 * _half_ring(p, _Group.of(p, t, p.tensor_nodes),
                                                            c.layer_activation_bytes) + params.tp_sync_ms))
    moe = (e > 1) & (c.moe_layers > 0)
    ep_ms = _when(moe, lambda: c.moe_layers / pp * MOE_ALL_TO_ALLS_FORWARD * (1 + train)
                  * _all_to_all(p, _Group.of(p, e, p.expert_nodes), c.moe_dispatch_bytes / t))
    launch = layers_per_stage * params.layer_overhead_ms
    # the host issues a stage's kernels whatever their size: a tensor-parallel shard has as many kernels as the
    # whole model, smaller ones; what the stage's device time cannot hide is exposed every micro-batch, and never
    # less than what one device exposes for the stage's share of the kernels (`overhead_ms`, from the device
    # predictor's kernel stream: exact for one device)
    host_stage = (c.host_forward_ms * (1 + p.checkpointing * train) + c.host_backward_ms * train) / pp
    host_exposed = _maximum(host_stage - (fwd + bwd + recompute), c.overhead_ms / pp)
    stage_ms = fwd + bwd + recompute + tp_ms + ep_ms + launch + host_exposed

    pp_ms = _when(pp > 1, lambda: (1 + train) * (m + pp - 2) * _send(p, c.layer_activation_bytes / t))

    # data parallel: dense gradients over the d replicas, expert gradients over the d/e holding the same experts.
    # RS = AG = half an all-reduce (rings; the one-node guard scales alike), so one half-ring per size.
    gradient_bytes = c.params * c.gradient_bytes_per_param / split
    expert_bytes = _where(moe, c.expert_params * c.gradient_bytes_per_param / split, 0.0)
    dense_bytes = gradient_bytes - expert_bytes
    overlap = params.dp_overlap * (1 - p.host_staged * (1 - NO_P2P_OVERLAP_SCALE))
    hidden_by_backward = overlap * (bwd + recompute + tp_ms * 0.5)
    hidden_by_forward = overlap * fwd

    def data_parallel() -> Any:
        group = _Group.of(p, d, p.nodes)
        half = _half_ring(p, group, dense_bytes) + _when(moe, lambda: _half_ring(
            p, _Group.of(p, d / e, p.expert_data_nodes), expert_bytes / e))
        bucket = _half_ring(p, group, _minimum(dense_bytes, _maximum(c.last_bucket_bytes / split, DDP_BUCKET_BYTES)))
        zero0 = _maximum(2 * half - hidden_by_backward, 2 * bucket)
        zero12 = _maximum(half - hidden_by_backward, bucket) + half
        zero3 = m * (_maximum(half - hidden_by_forward, bucket) + _maximum(2 * half - hidden_by_backward, 2 * bucket))
        return _where(p.zero_stage >= 3, zero3, _where(p.zero_stage >= 1, zero12, zero0))

    dp_ms = _when((d > 1) & (train > 0), data_parallel)
    jitter = replica_jitter(c.steps_vary, params)
    dp_wait = _when((d > 1) & (train > 0) & (jitter > 0),
                    lambda: jitter * expected_max_normal(d) * m * (fwd + bwd + recompute))

    # optimizer: a rank steps its share of the parameters, never saving more than the sharding's communication
    full_step = c.optimizer_ms * train / split
    expert_share = c.expert_params / _maximum(c.params, 1.0)
    kept = _where(p.zero_stage >= 1, 1 / d, 1 - _where(moe, expert_share * (1 - 1 / e), 0.0))
    optimizer = _maximum(full_step * kept, full_step - dp_ms - m * ep_ms)

    distributed = _where(t * pp * d > 1, 1.0, 0.0)
    overhead = params.overhead_ms + params.multi_device_overhead_ms * distributed
    out = {
        "forward": m * fwd,
        "backward": m * (bwd + recompute),
        "optimizer": optimizer,
        "communication": m * tp_ms + m * ep_ms + pp_ms + dp_ms + dp_wait,
        "pipeline_bubble": (pp - 1) * stage_ms,
        "overhead": overhead + m * (launch + host_exposed),
    }
    out["iter_time_ms"] = sum(out.values())
    out["tensor_parallel_ms"] = m * tp_ms
    out["expert_parallel_ms"] = m * ep_ms
    out["pipeline_p2p_ms"] = pp_ms
    out["data_parallel_ms"] = dp_ms
    out["data_parallel_wait_ms"] = dp_wait
    total = out["iter_time_ms"]
    shape = total.shape if isinstance(total, np.ndarray) else ()  # (np.shape of a float costs ~1 us)
    if shape:  # arrays: every component over every pair, also those no pair of the batch has (0 everywhere)
        out = {k: v if np.shape(v) == shape else np.broadcast_to(v, shape).copy() for k, v in out.items()}
    return out


def layer_stats(layer_outputs: list[int]) -> tuple[int, int]:
    """(blocks, bytes per block output) from the output sizes of a model's repeated blocks."""
    if not layer_outputs:
        return 1, 0
    return len(layer_outputs), int(math.ceil(float(np.median(layer_outputs))))

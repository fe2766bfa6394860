"""The iteration time of a job on a placement, as an explicit sum, vectorised over (job, placement) pairs.

Inputs: a job's *compute* on one device of the accelerator (`ShardCompute`: forward, backward, optimizer and
overhead of one micro-batch of the whole model, from the predictors of the earlier issues or from a measured
profile), the placement (`PlacementArrays`: degrees, micro-batches, nodes, the two links' α and β) and a few
fitted constants (`IterationParams`). With t, p, d the tensor, pipeline and data degrees and m micro-batches:

    stage time of one micro-batch  s = (fwd + bwd + recompute) / (t·p) · (1 + tp_penalty·(t-1))
                                       + tensor-parallel all-reduces of its layers
                                       + layer_overhead · layers / p      (host cost per block, any batch)
    compute                        = m · s                                  (every micro-batch through a stage)
    pipeline_bubble                = (p-1) · s                              (1F1B fill and drain)
    pipeline send/recv             = 2 · (m + p - 2) · send(layer activation / t)        (p > 1)
    data-parallel all-reduce       exposed = max(AR(G) - overlap · bwd_last, AR(bucket))  (d > 1)
    optimizer                      = optimizer / (t·p) / (d if ZeRO >= 1)
    overhead                       = compute overhead + overhead_ms (the framework's fixed cost per iteration)

    iteration = compute + pipeline_bubble + communication + optimizer + overhead,
    communication = tensor-parallel + pipeline + exposed data-parallel.

The gradient all-reduce of G = params·grad bytes/(t·p) runs in DDP buckets while backward still runs: all but
what backward cannot hide is overlapped, and the last bucket never is. ZeRO 1/2 replace it with a reduce-scatter
plus an all-gather (same volume); ZeRO-3/FSDP adds the forward all-gather of parameters (1.5× the volume).
Across nodes the all-reduce is hierarchical (`comm.hierarchical_allreduce_ms`) and never cheaper than the same
devices in one node: a spread placement has every link the consolidated one has, or a slower one.

Every function takes numpy arrays of equal length (one entry per (job, placement) pair), so a batch of ten
thousand pairs is a handful of array operations (`bench/placement_batch.py`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

PARAMS_FILE = "iteration_params.json"
DDP_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default bucket_cap_mb = 25
TP_ALLREDUCES_PER_LAYER = 4  # Megatron: 2 in forward (attention, MLP), 2 in backward
TP_ALLREDUCES_RECOMPUTE = 2  # the recomputed forward's


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


@dataclass(frozen=True)
class IterationParams:
    """The constants the placement measurements determine (`fit` in perfmodel.evaluation.placement)."""

    dp_overlap: float = 0.5  # fraction of the last backward that hides the gradient all-reduce
    overhead_ms: float = 0.0  # per-iteration framework cost (data loading, Python, launch gaps)
    multi_device_overhead_ms: float = 0.0  # per-iteration cost of any distributed run (DDP hooks, syncs)
    tp_penalty: float = 0.0  # compute inefficiency per extra tensor-parallel rank (smaller GEMMs)
    tp_sync_ms: float = 0.0  # per tensor-parallel all-reduce, beyond α-β: the wait for the slowest rank
    layer_overhead_ms: float = 0.0  # host-side cost per block per micro-batch (Python, launches), any batch size
    compute_scale: float = 1.0  # calibration of the compute predictor for the data it was fitted on
    source: str = "defaults"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IterationParams:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


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

    forward_ms: np.ndarray
    backward_ms: np.ndarray
    optimizer_ms: np.ndarray
    overhead_ms: np.ndarray
    params: np.ndarray
    gradient_bytes_per_param: np.ndarray
    layers: np.ndarray
    layer_activation_bytes: np.ndarray

    @classmethod
    def stack(cls, computes: list[ShardCompute]) -> ComputeArrays:
        return cls(**{f.name: np.array([getattr(c, f.name) for c in computes], dtype=float) for f in fields(cls)})


@dataclass(frozen=True)
class PlacementArrays:
    """A placement as arrays (one entry per pair, or broadcast), or floats for a single pair: degrees,
    micro-batches, layout, the links' α, β."""

    tensor: np.ndarray
    pipeline: np.ndarray
    data: np.ndarray
    micro_batches: np.ndarray
    zero_stage: np.ndarray
    checkpointing: np.ndarray  # 0/1
    nodes: np.ndarray  # nodes the data-parallel group spans
    intra_alpha_ms: np.ndarray
    intra_beta_ms_per_byte: np.ndarray
    inter_alpha_ms: np.ndarray
    inter_beta_ms_per_byte: np.ndarray


# The model is written once for arrays (many pairs) and plain floats (one pair: no numpy call overhead, ~10× faster
# for a single prediction). Arithmetic works on both; these three are the only functions it needs.
def _where(condition: Any, yes: Any, no: Any) -> Any:
    return np.where(condition, yes, no) if isinstance(condition, np.ndarray) else (yes if condition else no)


def _maximum(a: Any, b: Any) -> Any:
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def _minimum(a: Any, b: Any) -> Any:
    return np.minimum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else min(a, b)


def _ring(alpha: np.ndarray, beta: np.ndarray, size: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    return _where(ranks > 1, 2 * (ranks - 1) * alpha + 2 * (ranks - 1) / _maximum(ranks, 1) * size * beta, 0.0)


def _hierarchical(p: PlacementArrays, size: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """All-reduce of `size` bytes over `ranks` devices spread evenly over `p.nodes` nodes (one rail per device)."""
    n = _minimum(p.nodes, ranks)
    g = ranks / n
    intra = _where(g > 1, (g - 1) * p.intra_alpha_ms + (g - 1) / g * size * p.intra_beta_ms_per_byte, 0.0)
    inter = _where(n > 1, 2 * (n - 1) * p.inter_alpha_ms + 2 * (n - 1) / n * (size / g) * p.inter_beta_ms_per_byte
                     * g, 0.0)
    spread = 2 * intra + inter
    consolidated = _ring(p.intra_alpha_ms, p.intra_beta_ms_per_byte, size, ranks)
    return _where(n > 1, _maximum(spread, consolidated), consolidated)


def iteration_breakdown(c: ComputeArrays, p: PlacementArrays, params: IterationParams) -> dict[str, np.ndarray]:
    """Per-pair components (ms); `iteration_ms` is their explicit sum. Arrays in, arrays out; floats (one pair)
    in, floats out."""
    t, pp, d, m = p.tensor, p.pipeline, p.data, p.micro_batches
    split = t * pp
    scale = params.compute_scale * (1 + params.tp_penalty * (t - 1))
    fwd = c.forward_ms * scale / split
    bwd = c.backward_ms * scale / split
    recompute = fwd * p.checkpointing

    layers_per_stage = _maximum(c.layers / pp, 1.0)
    tp_calls = layers_per_stage * (TP_ALLREDUCES_PER_LAYER + TP_ALLREDUCES_RECOMPUTE * p.checkpointing)
    tp_ms = _where(t > 1, tp_calls * (_ring(p.intra_alpha_ms, p.intra_beta_ms_per_byte, c.layer_activation_bytes,
                                              t) + params.tp_sync_ms), 0.0)
    launch = layers_per_stage * params.layer_overhead_ms
    stage_ms = fwd + bwd + recompute + tp_ms + launch

    pp_message = c.layer_activation_bytes / t
    pp_ms = _where(pp > 1, 2 * (m + pp - 2) * (p.intra_alpha_ms + pp_message * p.intra_beta_ms_per_byte), 0.0)

    gradient_bytes = c.params * c.gradient_bytes_per_param / split
    volume = _where(p.zero_stage >= 3, 1.5, 1.0)
    allreduce = _hierarchical(p, gradient_bytes, d) * volume
    last_bucket = _hierarchical(p, _minimum(gradient_bytes, DDP_BUCKET_BYTES), d)
    hidden_by = params.dp_overlap * (bwd + recompute + tp_ms * 0.5)
    dp_ms = _where(d > 1, _maximum(allreduce - hidden_by, last_bucket), 0.0)

    optimizer = c.optimizer_ms / split / _where(p.zero_stage >= 1, d, 1)
    distributed = (t * pp * d) > 1
    overhead = c.overhead_ms + params.overhead_ms + params.multi_device_overhead_ms * distributed
    out = {
        "forward": m * fwd,
        "backward": m * (bwd + recompute),
        "optimizer": optimizer,
        "communication": m * tp_ms + pp_ms + dp_ms,
        "pipeline_bubble": (pp - 1) * stage_ms,
        "overhead": overhead + m * launch,
    }
    out["iteration_ms"] = sum(out.values())
    out["tensor_parallel_ms"] = m * tp_ms
    out["pipeline_p2p_ms"] = pp_ms
    out["data_parallel_ms"] = dp_ms
    return out


def layer_stats(layer_outputs: list[int]) -> tuple[int, int]:
    """(blocks, bytes per block output) from the output sizes of a model's repeated blocks."""
    if not layer_outputs:
        return 1, 0
    return len(layer_outputs), int(math.ceil(float(np.median(layer_outputs))))

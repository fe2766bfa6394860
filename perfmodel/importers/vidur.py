"""Vidur (microsoft/vidur, MLSys'24, MIT): fp16 transformer-layer op latencies and NCCL collective latencies.

Read (paths relative to the dataset root, see its PROVENANCE-upstream.md):

- `data/profiling/compute/<gpu>/<org>/<model>/mlp.csv[.gz]`: per row, one token count and tensor-parallel degree
  of one model, and the time of each op of a decoder layer (sarathi-serve, fp16, inference forward, CUDA events,
  ms). Every op becomes one record; the latency is the row's median (min, max, mean and std go to `extra`).
- `data/profiling/network/<node>/{all_reduce,send_recv}.csv[.gz]`: NCCL collectives on an fp16 buffer of `size`
  bytes over `num_workers` ranks, `devices_per_node` of them per node (median of the timed calls, ms).

Not read: `attention.csv` (absent from this copy; a different schema), anything else.

The model dimensions are in every row (n_embd, n_head, n_kv_head, n_expanded_embd, vocab_size, use_gated_mlp),
and the layer is vidur's reference `GPTModel` (vidur/profiling/mlp/mlp_impl.py at the staged commit), so each
projection's GEMM shape follows, with T = num_tokens, h = n_embd, d = h / n_head, f = n_expanded_embd, p = the
tensor-parallel degree (weights sharded as on each of p GPUs; vidur emulates TP on one GPU):

    attn_pre_proj  QKV, column-parallel  m = T, k = h,      n = (n_head + 2 n_kv_head) d / p
    attn_post_proj O, row-parallel       m = T, k = h / p,  n = h
    mlp_up_proj    column-parallel       m = T, k = h,      n = f / p  (2 f / p for a gated MLP: gate and up)
    mlp_down_proj  row-parallel          m = T, k = f / p,  n = h

and the others act on [T, width] tensors: emb (vocab / p rows, width h), input_layernorm and
post_attention_layernorm (RMSNorm where the model has a post-attention norm, which vidur only builds as RMSNorm;
LayerNorm otherwise: phi-2), attn_rope (q and k: width (n_head + n_kv_head) d / p), mlp_act (SiLU-and-mul reading
2 f / p and writing f / p for a gated MLP, GELU on f / p otherwise), add (the residual add, width h).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from perfmodel.importers.common import (
    DatasetImporter,
    DeviceResolver,
    ImportStats,
    compact,
    integer,
    number,
    read_csv,
    relative,
    rows,
)
from perfmodel.profilers.external import UPSTREAM_OP, OpClass, OpMeasurement

SOURCE: Final = "vidur"

# vidur's device folders -> the torch device name of the GPU (looked up as a catalog alias).
# Compute profiles: "only the SKU matters" (vidur/profiling/README.md); `a100` is an 80GB A100, shared by the
# DGX (SXM4) and the Azure NC96ads_A100_v4 (80GB PCIe) nodes; we take it to be the PCIe part of the Azure VMs
# vidur's authors profile on (an assumption, recorded in each record's extra["device_assumed"]).
COMPUTE_DEVICES: dict[str, tuple[str, bool]] = {  # folder -> (device name, assumed rather than documented)
    "a100": ("NVIDIA A100 80GB PCIe", True),
    "a40": ("NVIDIA A40", False),
    "h100": ("NVIDIA H100 80GB HBM3", True),
}
# Network profiles: the GPUs of each node kind (vidur/profiling/README.md, "Network (Collectives) profiling").
NETWORK_DEVICES: dict[str, tuple[str, bool]] = {
    "a100_dgx": ("NVIDIA A100-SXM4-80GB", False),  # A100 DGX, 8 x 80GB, NVSwitch
    "a100_pairwise_nvlink": ("NVIDIA A100 80GB PCIe", False),  # Azure NC96ads_A100_v4: 4 x A100 80GB, NVLink pairs
    "a40_pairwise_nvlink": ("NVIDIA A40", False),  # 8 x A40, NVLink pairs
    "h100_dgx": ("NVIDIA H100 80GB HBM3", False),  # H100 DGX
    "h100_pairwise_nvlink": ("NVIDIA H100 NVL", True),  # Azure NC H100 v5 pairs H100 NVL cards
}

# vidur's `mlp_act` is one of two kernels, named as the element-wise op whose work it does (the op name sets the
# bytes and FLOPs the per-op model sees, `lowering.ops.ELEMENTWISE_READS`): a gated MLP's SiLU-and-mul reads the
# gate and up halves and writes one (`mul`, as LLMServingSim's rows name it), phi-2's GELU reads one (`gelu`).
# Named `mlp_act`, as a one-read op, its SiLU-and-mul rows looked like an fp16 copy at a third of the bandwidth,
# and the model priced every large fp16 one-read kernel (ReLU, casts, layout transposes) so.
ACTIVATION_OP: dict[str, str] = {"silu_and_mul": "mul", "gelu": "gelu"}
# vidur's collective name -> the op class
COLLECTIVE_OP_CLASS: dict[str, OpClass] = {"all_reduce": "allreduce", "send_recv": "send_recv"}
STATS = ("min", "max", "mean", "median", "std")

FILE_PATTERNS = (
    "data/profiling/compute/*/*/*/mlp",
    "data/profiling/network/*/all_reduce",
    "data/profiling/network/*/send_recv",
)
MARKERS = ("data/profiling/compute", "data/profiling/network")


def _records(root: Path, paths: list[Path], stats: ImportStats, resolve: DeviceResolver) -> Iterator[OpMeasurement]:
    for path in paths:
        name = relative(root, path)
        parts = name.split("/")  # data/profiling/{compute,network}/<device>/...
        kind, folder = parts[2], parts[3]
        if kind == "compute":  # a100, a40: generic names, so only the mapped SKU is looked up
            device_name, assumed = COMPUTE_DEVICES.get(folder, (folder, False))
            device = resolve(device_name)
        else:  # a node kind: the catalog may list it as an alias of its GPU (a100_dgx), else the mapped SKU
            device_name, assumed = NETWORK_DEVICES.get(folder, (folder, False))
            device = resolve(folder, device_name)
        frame = read_csv(path)
        stats.files.append(name)
        if device is None:
            per_row = sum(f"time_stats.{op}.median" in frame.columns for op in MLP_OPS) if kind == "compute" else 1
            stats.unknown_devices[device_name] += len(frame) * per_row
            continue
        common = {"source_file": name, "device": device}
        facts: dict[str, Any] = {"node": folder} if kind == "network" else {"model": "/".join(parts[4:6])}
        if assumed:
            facts["device_assumed"] = True
        if kind == "compute":
            yield from (stats.count(r) for r in _mlp_records(frame, common, facts, stats))
        else:
            yield from (stats.count(r) for r in _collective_records(frame, common, facts, stats))


def _latency(row: dict[str, Any], op: str) -> tuple[float | None, dict[str, Any]]:
    values = {stat: number(row.get(f"time_stats.{op}.{stat}")) for stat in STATS}
    latency = values.pop("median")
    return latency, {f"{stat}_ms": value for stat, value in values.items()}


@dataclass(frozen=True)
class _MlpOp:
    """What one of vidur's MLP-stage timings is as a kernel: its op class, shape, facts and (when not vidur's
    own) the op's name."""

    op_class: OpClass
    shape: dict[str, Any]
    detail: dict[str, Any] = field(default_factory=dict)
    name: str | None = None


def _embedding(d: dict[str, Any], norm: OpClass) -> _MlpOp:
    return _MlpOp("embedding", {"batch": d["num_tokens"], "hidden": d["h"]},
                  {"vocab_size": d["vocab"], "vocab_rows": d["vocab"] // d["tensor_parallel"]})


def _norm(d: dict[str, Any], norm: OpClass) -> _MlpOp:
    return _MlpOp(norm, {"batch": d["num_tokens"], "hidden": d["h"]})


def _linear(m: str, k: str, n: str) -> Callable[[dict[str, Any], OpClass], _MlpOp]:
    """A GEMM whose M, K and N are `_gemm_dims` of the row (`m` tokens by `k` in, `n` out)."""
    def kernel(d: dict[str, Any], norm: OpClass) -> _MlpOp:
        dims = _gemm_dims(d)
        return _MlpOp("linear", {"batch": 1, "m": dims[m], "k": dims[k], "n": dims[n]})
    return kernel


def _gemm_dims(d: dict[str, Any]) -> dict[str, int]:
    tp, h, hd, heads, kv, f = d["tensor_parallel"], d["h"], d["head_dim"], d["n_head"], d["n_kv_head"], d["f"]
    return {"tokens": d["num_tokens"], "hidden": h, "qkv": (heads + 2 * kv) * hd // tp, "attn_out": heads * hd // tp,
            "up": (2 if d["gated"] else 1) * f // tp, "ffn": f // tp}


def _rope(d: dict[str, Any], norm: OpClass) -> _MlpOp:
    return _MlpOp("rope", {"batch": d["num_tokens"], "hidden": (d["n_head"] + d["n_kv_head"]) * d["head_dim"]
                           // d["tensor_parallel"]}, {"head_dim": d["head_dim"]})


def _activation(d: dict[str, Any], norm: OpClass) -> _MlpOp:
    """Named by the work it does (`ACTIVATION_OP`), vidur's name kept."""
    f = d["f"] // d["tensor_parallel"]
    activation = "silu_and_mul" if d["gated"] else "gelu"
    return _MlpOp("elementwise", {"batch": d["num_tokens"], "hidden": f},
                  {"activation": activation, UPSTREAM_OP: "mlp_act", **({"input_width": 2 * f} if d["gated"] else {})},
                  name=ACTIVATION_OP[activation])


def _residual_add(d: dict[str, Any], norm: OpClass) -> _MlpOp:
    """The residual add (of attention and MLP outputs too, for a layer without a post-attention norm)."""
    return _MlpOp("elementwise", {"batch": d["num_tokens"], "hidden": d["h"]},
                  {"operands": 2 if norm == "rmsnorm" else 3})


# each op of vidur's MLP-stage profile, in its column order, as a kernel, from the row's model dimensions (`_dims`)
# and the layer's norm kind
MLP_OP_KERNELS: dict[str, Callable[[dict[str, Any], OpClass], _MlpOp]] = {
    "emb": _embedding,
    "input_layernorm": _norm,
    "attn_pre_proj": _linear("tokens", "hidden", "qkv"),
    "attn_rope": _rope,
    "attn_post_proj": _linear("tokens", "attn_out", "hidden"),
    "post_attention_layernorm": _norm,
    "mlp_up_proj": _linear("tokens", "hidden", "up"),
    "mlp_act": _activation,
    "mlp_down_proj": _linear("tokens", "ffn", "hidden"),
    "add": _residual_add,
}
MLP_OPS: tuple[str, ...] = tuple(MLP_OP_KERNELS)


def _mlp_records(frame: Any, common: dict[str, Any], facts: dict[str, Any],
                 stats: ImportStats) -> Iterator[OpMeasurement]:
    ops = [op for op in MLP_OPS if f"time_stats.{op}.median" in frame.columns]
    # vidur builds a post-attention norm only as RMSNorm, and uses the same norm kind for both norms of a layer
    norm: OpClass = "rmsnorm" if "post_attention_layernorm" in ops else "layernorm"
    for index, row in rows(frame):
        dims = _dims(row)
        if dims is None:
            stats.skipped["vidur row without model dimensions"] += len(ops)
            continue
        for op in ops:
            latency, timing = _latency(row, op)
            if latency is None or latency <= 0:
                stats.skipped["no latency"] += 1
                continue
            kernel = MLP_OP_KERNELS[op](dims, norm)
            yield OpMeasurement(
                source=SOURCE, source_row=index, op_class=kernel.op_class, op_name=kernel.name or op, dtype="fp16",
                phase="forward", num_tokens=dims["num_tokens"], tensor_parallel=dims["tensor_parallel"],
                latency_ms=latency, extra=compact({**facts, **kernel.detail, **timing}), **common, **kernel.shape,
            )


def _dims(row: dict[str, Any]) -> dict[str, Any] | None:
    values: dict[str, Any] = {"num_tokens": integer(row.get("num_tokens")),
              "tensor_parallel": integer(row.get("num_tensor_parallel_workers")),
              "h": integer(row.get("n_embd")), "n_head": integer(row.get("n_head")),
              "n_kv_head": integer(row.get("n_kv_head")), "f": integer(row.get("n_expanded_embd")),
              "vocab": integer(row.get("vocab_size"))}
    if any(v is None or v <= 0 for v in values.values()):
        return None
    gated = row.get("use_gated_mlp")
    values["gated"] = gated is True or str(gated).lower() == "true"
    values["head_dim"] = values["h"] // values["n_head"]
    return values


def _collective_records(frame: Any, common: dict[str, Any], facts: dict[str, Any],
                        stats: ImportStats) -> Iterator[OpMeasurement]:
    for index, row in rows(frame):
        collective = str(row.get("collective"))
        op_class = COLLECTIVE_OP_CLASS.get(collective)
        if op_class is None:
            stats.skipped[f"vidur collective {collective!r}"] += 1
            continue
        latency, timing = _latency(row, collective)
        if latency is None or latency <= 0:
            stats.skipped["no latency"] += 1
            continue
        workers, per_node = integer(row.get("num_workers")), integer(row.get("devices_per_node"))
        nodes = math.ceil(workers / per_node) if workers and per_node else None
        yield OpMeasurement(
            source=SOURCE, source_row=index, op_class=op_class, op_name=collective, dtype="fp16", phase="forward",
            message_bytes=integer(row.get("size")), world_size=workers, nodes=nodes, latency_ms=latency,
            extra=compact({**facts, "devices_per_node": per_node,
                           "max_devices_per_node": integer(row.get("max_devices_per_node")),
                           "rank": integer(row.get("rank")), **timing}),
            **common,
        )


import_vidur = DatasetImporter(SOURCE, MARKERS, FILE_PATTERNS,
                               "expected data/profiling/compute/<gpu>/<org>/<model>/mlp.csv.gz", _records)
vidur_files = import_vidur.files_in

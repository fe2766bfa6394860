"""Phantora (QDelta/Phantora, NSDI'26, Apache-2.0): kernel times of PyTorch calls recorded during LLM training
steps on real GPUs, keyed by the exact call and shapes.

Read: `tests/perfdb/<gpu>/compute.csv` (`key,nanos`; the only GPU published is `l40s`, NVIDIA L40S). `key` is the
JSON of one PyTorch call, `{"<Op>": <args>}`: tensors as `["<dtype>", [dims]]` (codes bf16, f16, f32, f64, i64,
i32, b8; the long form `{"dtype": ..., "shape": [...]}` too), runs of repeated tensor lists as
`{"R": [k, [period...]]}` (the period repeated k times), `null` for an absent tensor, scalars as integers × 1e6.
`nanos` is the summed CUPTI kernel time of the call (no launch overhead: a tiny kernel reads ~1 µs where a CUDA-event
timing such as NeuSight's reads several µs). Rows of 0 ns (no kernel launched) are skipped. Not read:
`memcpy.csv` (copies, not ops), `manifest.md`.

Mapping (one table, `OPS`: op name -> how its arguments become a record; phase `backward` for the `...Backward`
ops, `forward` otherwise: a GEMM of the backward pass is recorded as the GEMM it is):

| op | record |
|---|---|
| MM (A m×k, B k×n), AddMM (bias, A, B) | `linear` batch 1, m, k, n |
| Linear (x (..., k), W (n, k), bias) | `linear` m = rows of x, k, n |
| MatMul (A (..., m, k), B) | B 2-D: `linear` m = rows of A; else `bmm` batch = the broadcast batch dims |
| BMM (A b×m×k, B b×k×n), BAddBMM (C, A, B) | `bmm` batch, m, k, n |
| Add, Add_, Mul, Mul_, Div, Div_, Sub, Sub_, Pow | `elementwise` add / mul / div / add / pow when two tensor operands have the output's numel, else the `u` (tensor-with-scalar) name: a scalar, a 0-d tensor or a small broadcast operand is read from cache, so the op reads one full tensor like NeuSight's tensor-with-scalar ops (the operands' shapes are kept in extra) |
| MulScalar, DivScalar, AddScalar | `elementwise` mulu / divu / addu |
| GELU, ReLU, Tanh, SiLU (+ their ...Backward: grad × f'(x)) | `elementwise` gelu / relu / tanh / mulu; backward: `mul` |
| Softmax, SoftmaxBackward ([x or grad, out], dim) | `softmax` batch = numel / size(dim), hidden = size(dim) |
| LayerNorm, RMSNorm (+ ...Backward) | `layernorm` batch = numel / last dim, hidden = last dim |
| SDPA, SDPABackward, Foreach*, ZerosLike, ConvDType (casts), Sum, Dropout, NativeDropoutBackward, MaskedFill(_), Where, WhereScalar | skipped, counted: no op class of the schema (attention, optimizer steps, fills, casts, reductions, random masks) |

Element-wise and vector shapes are the output's numel as batch × hidden, hidden = the output's last dim. The
dtype is the storage dtype of the op's largest floating tensor (bf16 -> bf16, f16 -> fp16, f32 -> fp32); a row
whose tensors are all integer, boolean, f64 or complex is skipped (counted). GELU, SiLU, ReLU, Tanh, LayerNorm and
RMSNorm are in the table though this DB holds none of them (its models fuse or decompose them): a newer DB's rows
would map.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from perfmodel.core.units import ns_to_ms
from perfmodel.importers.common import (
    DatasetImporter,
    DeviceResolver,
    ImportStats,
    Mapped,
    compact,
    integer,
    read_csv,
    relative,
    rows,
)
from perfmodel.profilers.external import DType, MeasuredPhase, OpClass, OpMeasurement

SOURCE: Final = "phantora"

# perfdb folders -> the device's name (looked up after the folder name itself)
DEVICES: dict[str, tuple[str, ...]] = {"l40s": ("NVIDIA L40S",)}
DTYPES: dict[str, DType] = {"bf16": "bf16", "f16": "fp16", "f32": "fp32", "BFloat16": "bf16", "Half": "fp16",
                          "Float": "fp32"}

FILE_PATTERNS = ("tests/perfdb/*/compute",)
MARKERS = ("tests/perfdb",)


@dataclass(frozen=True)
class Tensor:
    dtype: str  # Phantora's code: bf16, f32, i64, ... (long form: BFloat16, ComplexFloat, ...)
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def parse_key(key: str) -> tuple[str, Any]:
    """A compute.csv key -> (op name, its arguments with repeats expanded and tensors as `Tensor`s)."""
    call = json.loads(key)
    if not isinstance(call, dict) or len(call) != 1:
        raise ValueError(f"not a one-op call: {key[:80]}")
    (op, args), = call.items()
    return op, _decode(args)


def _is_tensor(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], list) and all(isinstance(d, int) for d in value[1]))


def _decode(value: Any) -> Any:
    if _is_tensor(value):
        return Tensor(value[0], tuple(value[1]))
    if isinstance(value, dict):
        if set(value) == {"R"}:  # {"R": [k, [period...]]}: the period k times
            count, period = value["R"]
            return [_decode(item) for _ in range(int(count)) for item in period]
        if set(value) == {"dtype", "shape"}:
            return Tensor(str(value["dtype"]), tuple(int(d) for d in value["shape"]))
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(item) for item in value]
    return value


def tensors(args: Any) -> list[Tensor]:
    """The tensors among the arguments (positional lists), in order; None for absent ones left out."""
    if isinstance(args, Tensor):
        return [args]
    if isinstance(args, list):
        return [t for t in args if isinstance(t, Tensor)]
    return []


MapFn = Callable[[list[Tensor], Any], "Mapped | None"]  # (tensors, raw args) -> record, None: shapes not usable


def _vector(op_class: OpClass, op_name: str, out: Tensor, hidden: int | None = None, **detail: Any) -> Mapped:
    numel = max(out.numel, 1)
    width = hidden if hidden is not None else (out.shape[-1] if out.shape else 1)
    width = min(max(width, 1), numel)
    return Mapped(op_class, op_name, {"batch": max(numel // width, 1), "hidden": width}, detail)


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    width = max(len(a), len(b))
    a, b = (1,) * (width - len(a)) + a, (1,) * (width - len(b)) + b
    if any(x != y and 1 not in (x, y) for x, y in zip(a, b)):
        return None
    return tuple(max(x, y) for x, y in zip(a, b))


def _gemm(a: Tensor, b: Tensor) -> Mapped | None:
    """A (..., m, k) @ B (..., k, n): a 2-D B is a weight (`linear`, A's batch folded into m), else `bmm`."""
    if len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != b.shape[-2]:
        return None
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if len(b.shape) == 2:
        return Mapped("linear", "linear", {"batch": 1, "m": math.prod(a.shape[:-1]), "k": k, "n": n}, {})
    batch = _broadcast(a.shape[:-2], b.shape[:-2])
    if batch is None:
        return None
    return Mapped("bmm", "bmm", {"batch": math.prod(batch), "m": m, "k": k, "n": n}, {})


def _mm(ts: list[Tensor], args: Any) -> Mapped | None:
    return _gemm(ts[0], ts[1]) if len(ts) >= 2 else None


def _addmm(ts: list[Tensor], args: Any) -> Mapped | None:  # (bias or C, A, B)
    mapped = _gemm(ts[-2], ts[-1]) if len(ts) >= 3 else None
    return mapped and Mapped(mapped.op_class, mapped.op_name, mapped.shape, {"accumulate": True})


def _linear(ts: list[Tensor], args: Any) -> Mapped | None:  # (x (..., k), W (n, k), bias?)
    if len(ts) < 2 or len(ts[1].shape) != 2 or not ts[0].shape or ts[0].shape[-1] != ts[1].shape[1]:
        return None
    x, w = ts[0], ts[1]
    return Mapped("linear", "linear", {"batch": 1, "m": math.prod(x.shape[:-1]), "k": w.shape[1], "n": w.shape[0]},
                  {"bias": len(ts) >= 3})


def _binary(name: str) -> MapFn:
    """add/mul/div/pow: the binary name when two tensors have the output's numel, else the `u` name."""
    def mapping(ts: list[Tensor], args: Any) -> Mapped | None:
        if not ts:
            return None
        shape = ts[0].shape
        for t in ts[1:]:
            shape = _broadcast(shape, t.shape) or shape
        out = Tensor(ts[0].dtype, shape)
        full = sum(t.numel == out.numel for t in ts)
        op_name = name if full >= 2 else name + "u"
        return _vector("elementwise", op_name, out,
                       operands=[list(t.shape) for t in ts] if len(ts) > 1 and full < len(ts) else None)
    return mapping


def _unary(name: str) -> MapFn:
    return lambda ts, args: _vector("elementwise", name, ts[0]) if ts else None


def _softmax(ts: list[Tensor], args: Any) -> Mapped | None:
    dim = next((a for a in reversed(args) if isinstance(a, int) and not isinstance(a, bool)), -1) \
        if isinstance(args, list) else -1
    if not ts or not ts[0].shape:
        return None
    out = ts[0]
    axis = dim % len(out.shape)
    return _vector("softmax", "softmax", out, hidden=out.shape[axis],
                   dim=axis if axis != len(out.shape) - 1 else None)


def _norm(kind: str) -> MapFn:
    return lambda ts, args: _vector("layernorm", "layernorm", ts[0], norm=kind) if ts and ts[0].shape else None


@dataclass(frozen=True)
class OpRule:
    phase: MeasuredPhase
    mapping: MapFn | None  # None: skipped
    skip: str = ""


def _fwd(mapping: MapFn) -> OpRule:
    return OpRule("forward", mapping)


def _bwd(mapping: MapFn) -> OpRule:
    return OpRule("backward", mapping)


def _skip(reason: str) -> OpRule:
    return OpRule("forward", None, reason)


OPS: dict[str, OpRule] = {
    "MM": _fwd(_mm), "MatMul": _fwd(_mm), "AddMM": _fwd(_addmm), "Linear": _fwd(_linear),
    "BMM": _fwd(_mm), "BAddBMM": _fwd(_addmm),
    **{op: _fwd(_binary("add")) for op in ("Add", "Add_", "Sub", "Sub_")},
    **{op: _fwd(_binary("mul")) for op in ("Mul", "Mul_")},
    **{op: _fwd(_binary("div")) for op in ("Div", "Div_")},
    "Pow": _fwd(_binary("pow")),
    "AddScalar": _fwd(_unary("addu")), "MulScalar": _fwd(_unary("mulu")), "DivScalar": _fwd(_unary("divu")),
    "GELU": _fwd(_unary("gelu")), "ReLU": _fwd(_unary("relu")), "Tanh": _fwd(_unary("tanh")),
    "SiLU": _fwd(_unary("mulu")),
    **{op: _bwd(_binary("mul")) for op in ("GELUBackward", "ReLUBackward", "TanhBackward", "SiLUBackward")},
    "Softmax": _fwd(_softmax), "SoftmaxBackward": _bwd(_softmax),
    "LayerNorm": _fwd(_norm("layernorm")), "LayerNormBackward": _bwd(_norm("layernorm")),
    "RMSNorm": _fwd(_norm("rmsnorm")), "RMSNormBackward": _bwd(_norm("rmsnorm")),
    "SDPA": _skip("fused attention (SDPA: no op class)"),
    "SDPABackward": _skip("fused attention (SDPA: no op class)"),
    "ZerosLike": _skip("fill (ZerosLike)"),
    "ConvDType": _skip("dtype cast (ConvDType)"),
    "Sum": _skip("reduction (Sum)"),
    "Dropout": _skip("dropout (random mask)"),
    "NativeDropoutBackward": _skip("dropout (random mask)"),
    **{op: _skip("masked fill / where") for op in ("MaskedFill", "MaskedFill_", "Where", "WhereScalar")},
}
SKIP_PREFIXES: dict[str, str] = {"Foreach": "optimizer step (Foreach*)"}


def storage_dtype(ts: list[Tensor]) -> DType | None:
    """The schema dtype of the largest floating tensor (bf16, fp16, fp32); None when there is none."""
    floats = [t for t in ts if t.dtype in DTYPES]
    return DTYPES[max(floats, key=lambda t: t.numel).dtype] if floats else None


def _records(root: Path, paths: list[Path], stats: ImportStats, resolve: DeviceResolver) -> Iterator[OpMeasurement]:
    for path in paths:
        name = relative(root, path)
        gpu = path.parent.name
        stats.files.append(name)
        frame = read_csv(path)
        device = resolve(gpu, *DEVICES.get(gpu, ()))
        if device is None:
            stats.unknown_devices[DEVICES.get(gpu, (gpu,))[0]] += len(frame)
            continue
        for index, row in rows(frame):
            record = _record(name, index, row, device, stats)
            if record is not None:
                yield stats.count(record)


def _record(name: str, index: int, row: dict[str, Any], device: str, stats: ImportStats) -> OpMeasurement | None:
    try:
        op, args = parse_key(str(row.get("key")))
    except (ValueError, TypeError) as exc:
        stats.skipped[f"unreadable key ({type(exc).__name__})"] += 1
        return None
    rule = OPS.get(op)
    if rule is None:
        prefix = next((p for p in SKIP_PREFIXES if op.startswith(p)), None)
        stats.skipped[SKIP_PREFIXES[prefix] if prefix else f"op {op} (no mapping)"] += 1
        return None
    if rule.mapping is None:
        stats.skipped[rule.skip] += 1
        return None
    nanos = integer(row.get("nanos"))
    if nanos is None or nanos <= 0:
        stats.skipped["no latency (0 ns: no kernel launched)"] += 1
        return None
    ts = tensors(args)
    dtype = storage_dtype(ts)
    if dtype is None:
        stats.skipped["no bf16/fp16/fp32 tensor (integer, bool, f64 or complex)"] += 1
        return None
    mapped = rule.mapping(ts, args)
    if mapped is None:
        stats.skipped[f"{op}: shapes not usable"] += 1
        return None
    extra = compact({"op": op, "tensors": [[t.dtype, list(t.shape)] for t in ts], "timing": "cupti kernel sum",
                     **mapped.detail})
    return OpMeasurement(source=SOURCE, source_file=name, source_row=index, device=device,
                         op_class=mapped.op_class, op_name=mapped.op_name, dtype=dtype, phase=rule.phase,
                         latency_ms=ns_to_ms(nanos), extra=extra, **mapped.shape)


import_phantora = DatasetImporter(SOURCE, MARKERS, FILE_PATTERNS,
                                  "expected tests/perfdb/<gpu>/compute.csv", _records)
phantora_files = import_phantora.files_in

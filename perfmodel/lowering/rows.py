"""Lowering: a graph's IR nodes as kernel rows (the schema of `perfmodel.lowering.ops`), one row per kernel.

`graph_op_rows(graph)` turns every IR node into kernel rows (`op_class` ∈ bmm, linear, conv2d, elementwise,
softmax, layernorm, with `op_name`, `dtype`, `device` and the shape columns `SHAPE_COLUMNS`), one row per kernel
the node stands for, forward and (training) backward. A per-op predictor then gives the graph's time as sums
(`perfmodel.predictor.device_ops.predict_graph_ms`). The mapping is one table, `ROW_RULES`: OpKind -> (forward
rows, backward rows). Every other builder of kernel rows (an FX label table's nodes, `perfmodel.evaluation.transfer`)
uses this module's `Row` and its constructors (`vector_row`, `linear_row`, `bmm_row`, `memory_row`).

Mapping (B = batch dims folded, numel = elements of the node's output unless said otherwise):

| kind | forward rows | backward rows |
|---|---|---|
| linear (linear, addmm) | `linear` M×K · (N×K)ᵀ (M = product of the leading dims) | `linear` dX (m=M, n=K, k=N), dW (m=N, n=K, k=M); the bias grad when there is a bias: `elementwise addu` M × N/2 (the bytes of reading dY once) |
| matmul, bmm (incl. eager attention's QKᵀ, PV) | `bmm` B×(M×K · K×N); a 2-D right operand folds B into M (batch 1) | `bmm` dA (M, n=K, k=N), dB (m=K, N, k=M) |
| einsum (two operands) | `bmm` from its equation (`einsum_shape`): B = indices of both operands and the output, M / N = of one operand and the output, K = summed; without an equation (older IR), M×N from the output, K from the FLOPs | as matmul |
| attention (fused SDPA) | the eager decomposition: `bmm` QKᵀ, `elementwise mulu` scale, `addu`/`add` mask (when a mask is an input), `softmax`, `elementwise mul` dropout (training, `attention_dropout`), `bmm` PV | `bmm` dA, dB of both GEMMs, `softmax`, dropout `mul`, scale `mulu` |
| attention (fused SDPA, `fused_attention`) | one fused kernel: one `bmm` row over the scores (M = Lq, N = the keys a query sees, K = d + dv: QKᵀ and PV; launch `FUSED`) | the fused backward kernel: one `bmm` row, K = 3d + 2dv (the scores recomputed, not saved, and the four gradient GEMMs) |
| conv | `conv2d` (groups folded into the batch; stride and padding inferred from the shapes); non-square or non-2-D convs: the implicit GEMM as `linear` | the data-grad and the weight-grad as two rows of the forward's shape (their FLOPs equal the forward's: exact, only the kernels differ), the bias grad as linear's |
| softmax (softmax, log_softmax) | `softmax` batch = numel / last dim, hidden = last dim | `softmax` of the same shape (y·(g − Σ y·g): one read-reduce-write pass like the forward) |
| layernorm (layer_norm, rms_norm) | `layernorm` hidden = normalised elements (the weight's numel, else the last dim) | `layernorm` of the same shape (the real kernel makes ~2 passes and reduces dγ/dβ) |
| batchnorm | training: `layernorm` batch = C, hidden = numel / C; eval: `elementwise mulu` (a scale and a shift) | `layernorm` of the same shape |
| activation | `elementwise` relu / gelu / tanh / silu / sigmoid by name (relu6, leaky_relu, hardtanh, threshold → relu; mish, elu, softplus → silu; silu and sigmoid with the work of `mulu`), else `mulu` | `elementwise mul` (grad × f'(x)); `gelu_grad` (the work of `mul`) for GELU and the SiLU-like ones, whose f' needs the exponential again |
| elementwise | `elementwise` add/mul/div/pow by op (sub, where, masked_fill, compare, logical, clamp, fill, arange, cumsum, ... → add; sqrt, rsqrt → pow; exp, log, erf, neg, ... → mulu); the binary name when two tensor inputs have the output's numel, else the `u` (tensor-with-scalar) name | add, sub, rsub: none (the gradient passes through, no kernel); mul, div, neg by a scalar: `mulu` (grad × constant); pow, sqrt, rsqrt: `pow`; others: `mul` (grad × local derivative) |
| dropout | `elementwise mul` (x × mask), training only; eval dropout is the identity: no rows | `elementwise mul` (grad × mask) |
| embedding | `elementwise addu` tokens × dim (a row gather: read and write tokens × dim) | `elementwise add` tokens × dim (scatter-add of the grad) + a memory row writing vocab × dim (zeroing the weight grad) |
| copy (cat, clone, contiguous, to, index, gather, pad, ...) | memory row of the IR's bytes; none for a `to` that changes neither dtype nor shape (it returns its input) | clone, contiguous, cat, stack, copy: none (the gradient is passed on or viewed); others: memory row (read the output grad, write the input grad) |
| reduction, pool, loss (not cross-entropy), optimizer, other | memory row of the IR's bytes (a max pool's named `maxpool` / `maxpoolu`, with the work of `add` / `addu`) | memory row of the IR's backward bytes (optimizer: none) |
| loss (cross_entropy) | `softmax` over the logits (N × C) | `softmax` of the same shape |
| rnn | one `linear` per weight matrix (m = tokens), `elementwise tanh` tokens × hidden for the gates | dX, dW `linear` per weight matrix, `elementwise mul` for the gates |
| view | none | none |

A *memory row* stands for a memory-bound kernel that reads R and writes W elements (the IR's bytes over the
node's float element size): `elementwise add` (reads 2, writes 1) with numel (R + W) / 3 when R ≥ 1.5 W, else
`elementwise addu` (reads 1, writes 1) with numel (R + W) / 2, so its bytes equal the node's; hidden = the last
dim of the node's largest tensor.

Which inputs need a gradient is not stored per input in the IR; the GEMM and conv rules emit
round(flops_bwd / flops_fwd) of their backward GEMMs (0, 1 or 2): one means the weight grad for linear and conv
(a first layer over a non-differentiable input), dA for matmul. So the backward GEMM rows' FLOPs equal the IR
node's `flops_bwd`. A node has backward rows when the IR gave it backward work (`flops_bwd` or `bytes_read_bwd`).

A fused SDPA node lowers to the eager decomposition unless `fused_attention` says the device runs it as one fused
kernel (PyTorch's flash or memory-efficient attention: FlashAttention's algorithm, the scores tiled through on-chip
memory, the softmax, scale, mask and dropout applied there, the backward recomputing the scores from the saved
log-sum-exp); `_scaled_dot_product_attention_math` is always the decomposition. The softmax's exponentials of a fused
kernel are not priced apart (they overlap its GEMMs).

Approximations worth knowing: softmax is assumed over the last dim (the IR does not keep `dim`); an attention node
that is not fused is the unfused (math) attention that eager Hugging Face models run; whether an attention has
dropout is not in the IR either (`attention_dropout`, default: in training); a causal mask passed as a tensor (not
`is_causal`: a padded batch) is a mask like any other. Every row has the `dtype` given, whatever the tensors' own
dtypes (int index tensors included).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph, Node, TensorMeta
from perfmodel.core.opkinds import OpKind, normalize_op_name
from perfmodel.lowering.ops import EAGER, FUSED, LIBRARY, MAX_POOL_ROW_NAMES, SHAPE_COLUMNS

FORWARD = "forward"
BACKWARD = "backward"

# the kernel-row schema (perfmodel.lowering.ops), and what this module adds: where each row comes from
ROW_COLUMNS = ("node_id", "node_op", "kind", "phase", "part", "op_class", "op_name", "dtype", "device", "launch",
               *SHAPE_COLUMNS)
DTYPES = ("fp32", "fp16", "bf16")

_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
             "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1}


@dataclass(frozen=True)
class Row:
    """One kernel: its class, NeuSight op name, shape fields and what part of the node's work it is."""

    op_class: str
    op_name: str
    part: str
    shape: Mapping[str, int]
    launch: str = EAGER


@dataclass(frozen=True)
class Context:
    """What a rule may look at besides the node: the graph's nodes by id and options."""

    nodes: Mapping[str, Node]
    training: bool
    attention_dropout: bool
    fused_attention: bool = False


RowsFn = Callable[[Node, Context], list[Row]]


# --- shape helpers -----------------------------------------------------------------------------------------------


def _prod(values: Iterable[int]) -> int:
    return math.prod(int(v) for v in values)


def _pos(value: float) -> int:
    return max(int(round(value)), 1)


def _is_float(t: TensorMeta) -> bool:
    return t.dtype.startswith(("float", "bfloat", "complex"))


def _out(node: Node) -> TensorMeta | None:
    return node.output_tensors[0] if node.output_tensors else None


def _numel(node: Node) -> int:
    out = _out(node)
    if out is not None:
        return max(out.numel, 1)
    return max((t.numel for t in node.input_tensors), default=1) or 1


def vector_row(op_class: str, op_name: str, part: str, numel: int, hidden: int) -> Row:
    """A row of `numel` elements as `batch` rows of `hidden` (softmax and layernorm normalise over `hidden`)."""
    numel = max(int(numel), 1)
    hidden = min(max(int(hidden), 1), numel)
    return Row(op_class, op_name, part, {"batch": _pos(numel / hidden), "hidden": hidden})


def bias_grad_row(grad_rows: int, width: int) -> Row:
    """The bias gradient: a reduction that reads the output's gradient (`grad_rows` × `width`) once and writes
    `width` values. Priced as the element-wise row of the bytes it reads, an `addu` pass (reads one, writes one)
    over `grad_rows` × width / 2 (its own write, one value per bias, left out), not as a pass over the whole
    gradient that would also write it back. The row count stays the gradient's, so that a job's rows stay affine
    in its batch (`perfmodel.predictor.batch_sweep`)."""
    half = max(int(width) // 2, 1)
    return vector_row("elementwise", "addu", "dbias", _pos(grad_rows) * half, half)


def _last_dim(t: TensorMeta | None) -> int:
    return t.shape[-1] if t is not None and t.shape else 1


def _elementwise(op_name: str, part: str, node: Node, numel: int | None = None) -> Row:
    """An element-wise row over the node's output (or `numel` elements), hidden = the output's last dim."""
    return vector_row("elementwise", op_name, part, _numel(node) if numel is None else numel, _last_dim(_out(node)))


def _element_size(node: Node) -> int:
    """Bytes of the node's main float element (the first float output or input); 4 when it has none."""
    for t in (*node.output_tensors, *node.input_tensors):
        if _is_float(t):
            return _ITEMSIZE.get(t.dtype, 4)
    return 4


def memory_row(read_elements: float, written_elements: float, hidden: int, part: str) -> Row:
    """A memory-bound kernel reading R and writing W elements as the element-wise row of equal bytes: `add`
    (reads 2, writes 1) when R >= 1.5 W, else `addu` (reads 1, writes 1)."""
    read, written = max(float(read_elements), 0.0), max(float(written_elements), 0.0)
    if read >= 1.5 * written:
        return vector_row("elementwise", "add", part, _pos((read + written) / 3), hidden)
    return vector_row("elementwise", "addu", part, _pos((read + written) / 2), hidden)


def _largest_last_dim(node: Node) -> int:
    tensors = [*node.output_tensors, *node.input_tensors]
    if not tensors:
        return 1
    return _last_dim(max(tensors, key=lambda t: t.numel))


def _memory_fwd(node: Node, ctx: Context, part: str = "fwd") -> list[Row]:
    size = _element_size(node)
    return [memory_row(node.bytes_read_fwd / size, node.bytes_written_fwd / size, _largest_last_dim(node), part)]


def _memory_bwd(node: Node, ctx: Context) -> list[Row]:
    size = _element_size(node)
    read, written = node.bytes_read_bwd / size, node.bytes_written_bwd / size
    if read == 0 and written == 0:  # backward FLOPs but no bytes recorded: the forward's traffic
        read, written = node.bytes_read_fwd / size, node.bytes_written_fwd / size
    return [memory_row(read, written, _largest_last_dim(node), "grad")]


# A max pool's memory rows carry names of their own, with the work of the memory rows they are (`maxpool` reads 2
# and writes 1 as `add`, `maxpoolu` as `addu`: `perfmodel.lowering.ops`), so a GPU prices them exactly as before,
# while a device adaptation can tell them from the additions and ReLUs over the same tensors: a CPU's NCHW max pool
# compares a window per output and takes 20-60x their time per byte.
MAX_POOL_OPS = frozenset({"max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "adaptive_max_pool2d",
                          "mkldnn_max_pool2d", "onnx::MaxPool", "onnx::GlobalMaxPool"})


def _pool_rows(node: Node, rows: list[Row]) -> list[Row]:
    if normalize_op_name(node.op) not in MAX_POOL_OPS:
        return rows
    return [replace(row, op_name=MAX_POOL_ROW_NAMES.get(row.op_name, row.op_name)) for row in rows]


def _pool_fwd(node: Node, ctx: Context) -> list[Row]:
    return _pool_rows(node, _memory_fwd(node, ctx))


def _pool_bwd(node: Node, ctx: Context) -> list[Row]:
    return _pool_rows(node, _memory_bwd(node, ctx))


def _none(node: Node, ctx: Context) -> list[Row]:
    return []


def grad_count(node: Node) -> int:
    """How many of a GEMM's (or conv's) two backward GEMMs the IR counted: round(flops_bwd / flops_fwd) in 0..2."""
    if node.flops_fwd <= 0:
        return 2 if node.flops_bwd > 0 else 0
    return min(max(int(round(node.flops_bwd / node.flops_fwd)), 0), 2)


# --- GEMMs -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gemm:
    """batch × (M×K · K×N)."""

    batch: int
    m: int
    n: int
    k: int


def bmm_row(g: Gemm, part: str) -> Row:
    """A `bmm` row: batch × (M×K · K×N)."""
    return Row("bmm", "bmm", part, {"batch": max(g.batch, 1), "m": max(g.m, 1), "n": max(g.n, 1),
                                    "k": max(g.k, 1)})


def linear_row(m: int, n: int, k: int, part: str, batch: int = 1) -> Row:
    """A `linear` row: a (batch·M)×K input times an N×K weight."""
    return Row("linear", "linear", part, {"batch": max(batch, 1), "m": max(m, 1), "n": max(n, 1), "k": max(k, 1)})


_GEMM_OPERANDS = {"addmm": (1, 2), "_addmm_activation": (1, 2), "baddbmm": (1, 2), "addmv": (1, 2)}


def _matmul_shape(node: Node) -> Gemm | None:
    """A (..., M, K) @ B (..., K, N) with broadcasting; 1-D operands are vectors. A right operand without batch
    dims is shared: its batch folds into M (batch 1)."""
    a_i, b_i = _GEMM_OPERANDS.get(normalize_op_name(node.op), (0, 1))
    if len(node.input_tensors) <= b_i:
        return None
    a, b = node.input_tensors[a_i].shape, node.input_tensors[b_i].shape
    if not a or not b:
        return None
    a = (1, a[0]) if len(a) == 1 else a
    b = (b[0], 1) if len(b) == 1 else b
    m, k, n = a[-2], a[-1], b[-1]
    a_batch, b_batch = a[:-2], b[:-2]
    if not b_batch:
        return Gemm(1, _prod(a_batch) * m, n, k)
    width = max(len(a_batch), len(b_batch))
    a_batch = (1,) * (width - len(a_batch)) + tuple(a_batch)
    b_batch = (1,) * (width - len(b_batch)) + tuple(b_batch)
    return Gemm(_prod(max(x, y) for x, y in zip(a_batch, b_batch)), m, n, k)


def _flops_shape(node: Node) -> Gemm:
    """Fallback for a GEMM whose operands cannot be read (an einsum without its equation): output (..., N), K from
    the IR's FLOPs."""
    out = _out(node)
    numel = _numel(node)
    n = _last_dim(out)
    return Gemm(1, _pos(numel / n), n, _pos(node.flops_fwd / (2 * numel)) if node.flops_fwd else 1)


def einsum_shape(equation: str, a: Sequence[int], b: Sequence[int]) -> Gemm | None:
    """The batched GEMM a two-operand einsum runs, from its equation and operand shapes: batch = the indices of both
    operands and the output, M = of the first operand and the output only, N = of the second and the output only,
    K = the indices summed over (in both operands, or in one and not the output). None where the equation has an
    ellipsis, not two operands, or indices the shapes do not match."""
    lhs, arrow, out = equation.partition("->")
    terms = lhs.split(",")
    if "." in equation or len(terms) != 2 or any(len(t) != len(s) for t, s in zip(terms, (a, b))):
        return None
    if not arrow:  # implicit output: the indices that appear once, in alphabetical order
        out = "".join(sorted(c for c in set(lhs) - {","} if lhs.count(c) == 1))
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, (a, b)):
        for index, dim in zip(term, shape):
            sizes[index] = max(sizes.get(index, 1), int(dim))  # a broadcast dimension is 1 on one side
    in_a, in_b, in_out = set(terms[0]), set(terms[1]), set(out)

    def size(indices: set[str]) -> int:
        return math.prod(sizes[c] for c in indices)

    return Gemm(size(in_a & in_b & in_out), size((in_a & in_out) - in_b), size((in_b & in_out) - in_a),
                size((in_a | in_b) - in_out))


EINSUM_OPS = frozenset({"einsum", "onnx::Einsum"})


def _gemm_shape(node: Node) -> Gemm:
    if normalize_op_name(node.op) in EINSUM_OPS:
        shape = None
        if node.equation and len(node.input_tensors) == 2:
            shape = einsum_shape(node.equation, node.input_tensors[0].shape, node.input_tensors[1].shape)
        return shape or _flops_shape(node)
    return _matmul_shape(node) or _flops_shape(node)


def gemm_backward(g: Gemm, count: int, first: str = "dA") -> list[Gemm]:
    """dA = dC (M×N) · Bᵀ (N×K) and dB = Aᵀ (K×M) · dC (M×N); `count` of them, `first` when only one."""
    d_a, d_b = Gemm(g.batch, g.m, g.k, g.n), Gemm(g.batch, g.k, g.n, g.m)
    if count >= 2:
        return [d_a, d_b]
    if count == 1:
        return [d_a] if first == "dA" else [d_b]
    return []


def _matmul_fwd(node: Node, ctx: Context) -> list[Row]:
    return [bmm_row(_gemm_shape(node), "fwd")]


def _matmul_bwd(node: Node, ctx: Context) -> list[Row]:
    grads = gemm_backward(_gemm_shape(node), grad_count(node), first="dA")
    return [bmm_row(g, part) for g, part in zip(grads, ("dA", "dB") if len(grads) == 2 else ("dA",))]


def _linear_shape(node: Node) -> tuple[int, int, int, bool]:
    """(M, N, K, has bias) of linear(x (..., K), w (N, K), b) or addmm(b, x (M, K), w (K, N))."""
    name = normalize_op_name(node.op)
    ts = node.input_tensors
    if name in _GEMM_OPERANDS and len(ts) >= 3:
        g = _matmul_shape(node)
        if g is not None:
            return g.batch * g.m, g.n, g.k, True
    if len(ts) >= 2 and ts[0].shape and len(ts[1].shape) == 2:
        k = ts[0].shape[-1]
        n = ts[1].shape[0]
        return _pos(ts[0].numel / max(k, 1)), n, k, len(ts) >= 3
    g = _flops_shape(node)
    return g.batch * g.m, g.n, g.k, False


def _linear_fwd(node: Node, ctx: Context) -> list[Row]:
    m, n, k, _ = _linear_shape(node)
    return [linear_row(m, n, k, "fwd")]


def _linear_bwd(node: Node, ctx: Context) -> list[Row]:
    m, n, k, bias = _linear_shape(node)
    count = grad_count(node)
    rows = []
    if count >= 2:
        rows.append(linear_row(m, k, n, "dX"))  # dX (M×K) = dY (M×N) · W (N×K)
    if count >= 1:
        rows.append(linear_row(n, k, m, "dW"))  # dW (N×K) = dYᵀ (N×M) · X (M×K)
    if bias and count >= 1:
        rows.append(bias_grad_row(m, n))  # db = Σ over the M rows of dY
    return rows


# --- attention ---------------------------------------------------------------------------------------------------


def _attention_shapes(node: Node) -> tuple[Gemm, Gemm, bool] | None:
    """QKᵀ and PV of q (..., Lq, D), k (..., Lk, D), v (..., Lk, Dv), and whether a mask is an input."""
    ts = node.input_tensors
    if len(ts) < 3 or any(len(t.shape) < 2 for t in ts[:3]):
        return None
    q, k, v = ts[0].shape, ts[1].shape, ts[2].shape
    batch = _prod(q[:-2])
    lq, d, lk, dv = q[-2], q[-1], k[-2], v[-1]
    return Gemm(batch, lq, lk, d), Gemm(batch, lq, dv, lk), len(ts) > 3


# the SDPA op that is the decomposition on every device (PyTorch's math backend)
MATH_ATTENTION_OPS = frozenset({"_scaled_dot_product_attention_math"})


def _fused(node: Node, ctx: Context) -> bool:
    return ctx.fused_attention and normalize_op_name(node.op) not in MATH_ATTENTION_OPS


def causal_keys(lq: int, lk: int) -> int:
    """Keys a query sees on average under `is_causal` (PyTorch's top-left alignment: query i sees keys 0..i)."""
    seen = lq * (lq + 1) // 2 if lq <= lk else lk * (lk + 1) // 2 + (lq - lk) * lk
    return max(round(seen / max(lq, 1)), 1)


def fused_attention_gemm(shapes: tuple[Gemm, Gemm, bool], causal: bool, backward: bool) -> Gemm:
    """The fused kernel of an attention node (`_attention_shapes`) as one GEMM over its scores, Lq × keys (the keys
    a query sees: `causal_keys` for a causal one), whose K sums what each score costs: d + dv in the forward (QKᵀ,
    PV), and 3d + 2dv in the backward (the scores again, dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K, dKᵀ = Qᵀ·dS). So its
    FLOPs are the kernel's matmul FLOPs, 2.5 times the forward's in the backward as FlashAttention counts them."""
    scores, context, _ = shapes
    d, dv = scores.k, context.n
    keys = causal_keys(scores.m, scores.n) if causal else scores.n
    return Gemm(scores.batch, scores.m, keys, 3 * d + 2 * dv if backward else d + dv)


def _fused_row(gemm: Gemm, part: str) -> Row:
    return replace(bmm_row(gemm, part), launch=FUSED)


def _attention_fwd(node: Node, ctx: Context) -> list[Row]:
    shapes = _attention_shapes(node)
    if shapes is None:
        return _memory_fwd(node, ctx)
    if _fused(node, ctx):
        return [_fused_row(fused_attention_gemm(shapes, node.causal, backward=False), "fused")]
    scores, context, masked = shapes
    numel, lk = scores.batch * scores.m * scores.n, scores.n
    rows = [bmm_row(scores, "scores"), vector_row("elementwise", "mulu", "scale", numel, lk)]
    if masked:
        mask = node.input_tensors[3]
        rows.append(vector_row("elementwise", "add" if mask.numel == numel else "addu", "mask", numel, lk))
    rows.append(vector_row("softmax", "softmax", "softmax", numel, lk))
    if ctx.training and ctx.attention_dropout:
        rows.append(vector_row("elementwise", "mul", "dropout", numel, lk))
    rows.append(bmm_row(context, "context"))
    return rows


def _attention_bwd(node: Node, ctx: Context) -> list[Row]:
    shapes = _attention_shapes(node)
    if shapes is None:
        return _memory_bwd(node, ctx)
    if _fused(node, ctx):
        return [_fused_row(fused_attention_gemm(shapes, node.causal, backward=True), "fused")]
    scores, context, _ = shapes
    numel, lk = scores.batch * scores.m * scores.n, scores.n
    rows = [bmm_row(g, f"context.{part}") for g, part in zip(gemm_backward(context, 2), ("dA", "dB"))]
    if ctx.training and ctx.attention_dropout:
        rows.append(vector_row("elementwise", "mul", "dropout", numel, lk))
    rows.append(vector_row("softmax", "softmax", "softmax", numel, lk))
    rows.append(vector_row("elementwise", "mulu", "scale", numel, lk))
    rows += [bmm_row(g, f"scores.{part}") for g, part in zip(gemm_backward(scores, 2), ("dA", "dB"))]
    return rows


# --- convolutions ------------------------------------------------------------------------------------------------


def infer_stride_padding(size: int, out: int, kernel: int) -> tuple[int, int] | None:
    """(stride, padding) with (size + 2·padding − kernel) // stride + 1 == out: the smallest stride, and for it
    'same' padding ((kernel − 1) // 2) first, then 0, then the others. None when none fits (dilation)."""
    for stride in range(1, max(size, 1) + 1):
        for padding in dict.fromkeys([(kernel - 1) // 2, 0, kernel // 2, *range(kernel + 1)]):
            if (size + 2 * padding - kernel) // stride + 1 == out and size + 2 * padding >= kernel:
                return stride, padding
    return None


@dataclass(frozen=True)
class Conv:
    batch: int  # N × groups
    cin: int  # per group
    cout: int  # per group
    in_spatial: tuple[int, ...]
    out_spatial: tuple[int, ...]
    kernel: tuple[int, ...]


def _conv_shape(node: Node) -> Conv | None:
    """A conv over x (N, Cin, *S) with weight (Cout, Cin/g, *k) -> (N, Cout, *S'); a transposed conv (weight
    (Cin, Cout/g, *k), output larger than the input) as the conv it is the data-grad of."""
    ts = node.input_tensors
    out = _out(node)
    if len(ts) < 2 or out is None or len(ts[0].shape) < 3 or len(ts[1].shape) != len(ts[0].shape):
        return None
    x, w = ts[0].shape, ts[1].shape
    n, cin, cout = x[0], x[1], out.shape[1]
    in_sp, out_sp, kernel = tuple(x[2:]), tuple(out.shape[2:]), tuple(w[2:])
    transposed = "transpose" in node.op or (w[0] == cin and _prod(out_sp) > _prod(in_sp))
    if transposed:
        groups = max(cout // max(w[1], 1), 1)
        return Conv(n * groups, cout // groups, cin // groups, out_sp, in_sp, kernel)
    groups = max(cin // max(w[1], 1), 1)
    return Conv(n * groups, cin // groups, cout // groups, in_sp, out_sp, kernel)


def conv_spatial_dims(node: Node) -> int:
    """How many spatial axes a convolution node runs over (2 for a 2-D convolution; 0 where its shapes are unknown)."""
    c = _conv_shape(node)
    return 0 if c is None else len(c.in_spatial)


WINOGRAD_KERNEL = (3, 3)


def winograd_shaped(node: Node) -> bool:
    """A 2-D convolution of the shape cuDNN's (and MIOpen's) Winograd kernels take: 3 x 3, stride 1 on both axes,
    one group, no dilation, not transposed."""
    c = _conv_shape(node)
    if c is None or c.kernel != WINOGRAD_KERNEL or node.dilation > 1 or "transpose" in node.op:
        return False
    if c.batch != node.input_tensors[0].shape[0]:  # grouped: the groups are folded into the batch
        return False
    fits = [infer_stride_padding(size, out, k) for size, out, k in zip(c.in_spatial, c.out_spatial, c.kernel)]
    return all(fit is not None and fit[0] == 1 for fit in fits)


def depthwise(node: Node) -> bool:
    """A depthwise convolution: one group per input channel (weight (Cout, 1, *k), Cin > 1), not transposed.
    PyTorch runs it in its own channels-first depthwise kernel, or cuDNN's depthwise path for large fp16 ones
    (`ConvParams::use_cudnn_depthwise`; MIOpen's depthwise convolution on ROCm): not a tensor-core implicit GEMM."""
    c = _conv_shape(node) if node.kind.value == "conv" and "transpose" not in node.op else None
    # grouped: the groups are folded into the batch; one input channel per group
    return c is not None and c.cin == 1 and c.batch != node.input_tensors[0].shape[0]


def _conv_row(node: Node, part: str) -> Row:
    c = _conv_shape(node)
    if c is None:
        g = _flops_shape(node)
        return linear_row(g.batch * g.m, g.n, g.k, part)
    square = (len(c.in_spatial) == 2 and c.in_spatial[0] == c.in_spatial[1] and c.out_spatial[0] == c.out_spatial[1]
              and c.kernel[0] == c.kernel[1])
    fit = infer_stride_padding(c.in_spatial[0], c.out_spatial[0], c.kernel[0]) if square else None
    if fit is None:  # the implicit GEMM, groups as the batch: FLOPs exact
        return linear_row(_prod(c.out_spatial) * c.batch, c.cout, c.cin * _prod(c.kernel), part)
    stride, padding = fit
    return Row("conv2d", "conv2d", part, {"batch": c.batch, "in_channels": c.cin, "out_channels": c.cout,
                                          "kernel_size": c.kernel[0], "input_size": c.in_spatial[0],
                                          "stride": stride, "padding": padding})


def _conv_fwd(node: Node, ctx: Context) -> list[Row]:
    return [_conv_row(node, "fwd")]


def _conv_bwd(node: Node, ctx: Context) -> list[Row]:
    count = grad_count(node)
    parts = ("dX", "dW") if count >= 2 else ("dW",) if count == 1 else ()
    rows = [_conv_row(node, part) for part in parts]
    out = _out(node)
    if count and len(node.input_tensors) >= 3 and out is not None and len(out.shape) >= 2:
        rows.append(bias_grad_row(out.numel // max(out.shape[1], 1), out.shape[1]))
    return rows


# --- normalisation, softmax --------------------------------------------------------------------------------------


def _softmax_fwd(node: Node, ctx: Context, part: str = "fwd") -> list[Row]:
    return [vector_row("softmax", "softmax", part, _numel(node), _last_dim(_out(node)))]


def _softmax_bwd(node: Node, ctx: Context) -> list[Row]:
    return _softmax_fwd(node, ctx, "grad")


def _layernorm_shape(node: Node) -> tuple[int, int]:
    numel = _numel(node)
    ts = node.input_tensors
    weight = ts[1].numel if len(ts) >= 2 and ts[1].shape else 0
    hidden = weight if weight and numel % weight == 0 else _last_dim(_out(node))
    return numel, hidden


def _layernorm_fwd(node: Node, ctx: Context, part: str = "fwd") -> list[Row]:
    numel, hidden = _layernorm_shape(node)
    return [vector_row("layernorm", "layernorm", part, numel, hidden)]


def _layernorm_bwd(node: Node, ctx: Context) -> list[Row]:
    return _layernorm_fwd(node, ctx, "grad")


def _batchnorm_rows(node: Node, part: str) -> list[Row]:
    numel = _numel(node)
    out = _out(node)
    channels = out.shape[1] if out is not None and len(out.shape) >= 2 else 1
    # statistics over N·H·W per channel: each channel is a row normalised over numel / C elements
    return [Row("layernorm", "layernorm", part, {"batch": max(channels, 1), "hidden": _pos(numel / channels)})]


def _batchnorm_fwd(node: Node, ctx: Context) -> list[Row]:
    if node.flops_fwd <= 2 * _numel(node):  # running statistics: a scale and a shift (the IR's eval cost)
        return [_elementwise("mulu", "fwd", node)]
    return _batchnorm_rows(node, "fwd")


def _batchnorm_bwd(node: Node, ctx: Context) -> list[Row]:
    return _batchnorm_rows(node, "grad")


# --- element-wise ------------------------------------------------------------------------------------------------

# ATen op -> NeuSight element-wise base name (binary; + "u" for the tensor-with-scalar variant)
ELEMENTWISE_NAMES: dict[str, str] = {
    **dict.fromkeys(("mul", "mul_scalar", "addcmul", "square"), "mul"),
    **dict.fromkeys(("div", "remainder", "fmod", "addcdiv", "reciprocal"), "div"),
    **dict.fromkeys(("pow", "sqrt", "rsqrt"), "pow"),
    **dict.fromkeys(("exp", "log", "erf", "sin", "cos", "log1p", "expm1", "neg", "abs", "sign", "floor", "ceil",
                     "round", "bitwise_not", "logical_not", "__invert__", "isnan", "isinf", "isneginf",
                     "isposinf", "nan_to_num"), "mulu"),
}
ELEMENTWISE_DEFAULT = "add"  # add, sub, rsub, where, masked_fill, compares, logical ops, clamp, fill, arange, ...
# SiLU-like activations (an exponential per element: silu, mish, elu, softplus) and sigmoid are rows of their own
# names with the work of `mulu` (`perfmodel.lowering.ops`): a GPU prices them as the memory-bound passes they are,
# while a device adaptation can tell them from the cheap ones (on a CPU they take 6x a ReLU's time, as GELU does)
EXP_ACTIVATIONS = ("silu", "mish", "elu", "selu", "celu", "softplus")
ACTIVATION_NAMES: dict[str, str] = {
    **dict.fromkeys(("relu", "relu6", "leaky_relu", "hardtanh", "threshold", "prelu", "_prelu_kernel"), "relu"),
    "gelu": "gelu",
    "tanh": "tanh",
    **dict.fromkeys(EXP_ACTIVATIONS, "silu"),
    "sigmoid": "sigmoid",
}
ACTIVATION_DEFAULT = "mulu"
# backward: no kernel (the gradient passes through unchanged)
PASS_THROUGH_GRADIENT = frozenset({"add", "sub", "rsub", "add_scalar", "clone", "contiguous", "cat", "stack", "copy",
                                   "_copy_from", "lift_fresh_copy", "alias",
                                   "onnx::Add", "onnx::Sub", "onnx::Concat", "onnx::Identity"})
BACKWARD_NAMES: dict[str, str] = {
    **dict.fromkeys(("pow", "sqrt", "rsqrt"), "pow"),
    # grad × f'(x) where f' needs the exponential again (the work of `mul`); tanh's and sigmoid's come from the output
    **dict.fromkeys(("gelu", *EXP_ACTIVATIONS), "gelu_grad"),
}
BACKWARD_DEFAULT = "mul"
# linear in their one tensor input: the gradient is grad × a constant (one read), when the other operand is a scalar
SCALAR_LINEAR = frozenset({"mul", "mul_scalar", "div", "neg"})


def _binary(node: Node) -> bool:
    """Two tensor inputs with the output's numel: the binary op; else the tensor-with-scalar (`u`) one."""
    numel = _numel(node)
    return sum(1 for t in node.input_tensors if t.numel == numel) >= 2


def elementwise_name(node: Node) -> str:
    """The NeuSight op name of an element-wise or activation node."""
    name = normalize_op_name(node.op)
    if node.kind == OpKind.activation:
        return ACTIVATION_NAMES.get(name, ACTIVATION_DEFAULT)
    base = ELEMENTWISE_NAMES.get(name, ELEMENTWISE_DEFAULT)
    if base == "mulu":
        return base
    return base if _binary(node) else base + "u"


def _elementwise_fwd(node: Node, ctx: Context) -> list[Row]:
    return [_elementwise(elementwise_name(node), "fwd", node)]


def _elementwise_bwd(node: Node, ctx: Context) -> list[Row]:
    name = normalize_op_name(node.op)
    if name in PASS_THROUGH_GRADIENT:
        return []
    if name in SCALAR_LINEAR and not _binary(node):
        return [_elementwise("mulu", "grad", node)]
    return [_elementwise(BACKWARD_NAMES.get(name, BACKWARD_DEFAULT), "grad", node)]


def _dropout_fwd(node: Node, ctx: Context) -> list[Row]:
    if node.flops_fwd <= 0 or not ctx.training:  # eval (train=False): the identity, no kernel
        return []
    if not ctx.attention_dropout and _after_softmax(node, ctx):
        return []
    return [_elementwise("mul", "fwd", node)]


def _dropout_bwd(node: Node, ctx: Context) -> list[Row]:
    if not _dropout_fwd(node, ctx):
        return []
    return [_elementwise("mul", "grad", node)]


def _after_softmax(node: Node, ctx: Context, hops: int = 3) -> bool:
    """A dropout over attention probabilities: its input comes from a softmax, possibly through views and copies
    (HF casts the probabilities back to the query's dtype)."""
    for i in node.inputs:
        producer = ctx.nodes.get(i)
        if producer is None:
            continue
        if producer.kind == OpKind.softmax:
            return True
        if hops > 0 and producer.kind in (OpKind.view, OpKind.copy) and _after_softmax(producer, ctx, hops - 1):
            return True
    return False


# --- memory-bound ops --------------------------------------------------------------------------------------------


def _embedding_shape(node: Node) -> tuple[int, int, int]:
    """(tokens, dim, vocab) of embedding(weight (V, D), indices)."""
    ts = node.input_tensors
    out = _out(node)
    dim = _last_dim(out)
    vocab = ts[0].shape[0] if ts and len(ts[0].shape) == 2 else 1
    return _pos(_numel(node) / max(dim, 1)), dim, vocab


def _embedding_fwd(node: Node, ctx: Context) -> list[Row]:
    tokens, dim, _ = _embedding_shape(node)
    return [vector_row("elementwise", "addu", "fwd", tokens * dim, dim)]


def _embedding_bwd(node: Node, ctx: Context) -> list[Row]:
    tokens, dim, vocab = _embedding_shape(node)
    return [vector_row("elementwise", "add", "grad", tokens * dim, dim),
            memory_row(0, vocab * dim, dim, "zero_grad")]  # a fill: writes the weight grad, reads nothing


# conversions that return their input (no kernel) when dtype and shape do not change
_CONVERSIONS = frozenset({"to", "type_as"})


def _is_noop_conversion(node: Node) -> bool:
    if normalize_op_name(node.op) not in _CONVERSIONS or not node.input_tensors or not node.output_tensors:
        return False
    src, dst = node.input_tensors[0], node.output_tensors[0]
    return src.dtype == dst.dtype and src.shape == dst.shape


def _copy_fwd(node: Node, ctx: Context) -> list[Row]:
    if _is_noop_conversion(node):
        return []
    return _memory_fwd(node, ctx)


def _copy_bwd(node: Node, ctx: Context) -> list[Row]:
    if normalize_op_name(node.op) in PASS_THROUGH_GRADIENT or _is_noop_conversion(node):
        return []
    grad_in = sum(t.numel for t in node.input_tensors if _is_float(t))
    return [memory_row(_numel(node), grad_in or _numel(node), _largest_last_dim(node), "grad")]


_SOFTMAX_LOSSES = frozenset({"cross_entropy_loss"})


def _loss_fwd(node: Node, ctx: Context) -> list[Row]:
    ts = node.input_tensors
    if normalize_op_name(node.op) in _SOFTMAX_LOSSES and ts and len(ts[0].shape) >= 2:
        logits = ts[0]
        classes = logits.shape[1] if len(logits.shape) > 2 else logits.shape[-1]
        return [vector_row("softmax", "softmax", "fwd", logits.numel, classes)]
    return _memory_fwd(node, ctx)


def _loss_bwd(node: Node, ctx: Context) -> list[Row]:
    rows = _loss_fwd(node, ctx)
    if rows and rows[0].op_class == "softmax":
        return [Row(r.op_class, r.op_name, "grad", r.shape) for r in rows]
    return _memory_bwd(node, ctx)


@dataclass(frozen=True)
class _Rnn:
    """What an RNN node (aten.lstm / gru / rnn_tanh: input, hidden state(s), then each layer and direction's input
    and recurrent weights and biases) computes: `weights` are the 2-D weights in that order, input-to-hidden at even
    positions and hidden-to-hidden (recurrent) at odd ones."""

    tokens: int  # steps x batch: every position of the sequence
    batch: int  # sequences advanced together (the hidden state's batch); `tokens` when it cannot be told
    weights: list[tuple[int, int]]  # (out, in) of each weight matrix

    @property
    def steps(self) -> int:
        return max(self.tokens // max(self.batch, 1), 1)


def _rnn_parts(node: Node) -> _Rnn:
    ts = node.input_tensors
    x = ts[0] if ts else None
    tokens = _pos(x.numel / max(_last_dim(x), 1)) if x is not None else 1
    state = next((t for t in ts[1:3] if len(t.shape) == 3 and _is_float(t)), None)  # (layers x dirs, batch, h)
    batch = int(state.shape[1]) if state is not None and tokens % max(int(state.shape[1]), 1) == 0 else tokens
    weights = [(t.shape[0], t.shape[1]) for t in ts[1:] if len(t.shape) == 2 and _is_float(t)]
    return _Rnn(tokens, batch, weights)


def _rnn_rows(node: Node, backward: bool) -> list[Row]:
    """Input-to-hidden GEMMs over every position at once; the recurrence one step at a time (a step needs the
    previous step's hidden state): per step and recurrent weight, a batch x 4h GEMM and the gates' pointwise
    kernel, forward and backward through time. The FLOPs are those of one GEMM over all positions; the kernels are
    many and small, as cuDNN runs them. Weight gradients are one GEMM over every position each (cuDNN accumulates
    them after the sequential pass)."""
    rnn = _rnn_parts(node)
    suffix = ".dX" if backward else ""
    rows = []
    for i, (n, k) in enumerate(rnn.weights):
        if i % 2 == 0:
            out, inner = (k, n) if backward else (n, k)
            rows.append(linear_row(rnn.tokens, out, inner, f"w{i}{suffix}"))
        else:
            rows += recurrent_rows(n, k, rnn.batch, rnn.steps, backward, f"w{i}")
        if backward:
            rows.append(linear_row(n, k, rnn.tokens, f"w{i}.dW"))
    return rows


def recurrent_rows(gate_width: int, hidden: int, batch: int, steps: int, backward: bool, part: str) -> list[Row]:
    """The sequential part of one recurrent layer, as cuDNN runs it: per step, the `batch` x `gate_width` GEMM on
    the `hidden`-wide state (its transpose backward) and the gates' pointwise kernel, `steps` times (the recurrent
    weight's gradient, one GEMM over every position, is not in it). `part` names the recurrent weight. One library
    call launches them back to back (`LIBRARY`)."""
    out, inner = (hidden, gate_width) if backward else (gate_width, hidden)
    suffix, gates = (".dX", "mul") if backward else ("", "tanh")
    step = [linear_row(batch, out, inner, f"{part}{suffix}.step"),
            vector_row("elementwise", gates, "gates", batch * gate_width, gate_width)]
    return [replace(row, launch=LIBRARY) for row in step] * steps


def _rnn_fwd(node: Node, ctx: Context) -> list[Row]:
    return _rnn_rows(node, backward=False)


def _rnn_bwd(node: Node, ctx: Context) -> list[Row]:
    return _rnn_rows(node, backward=True)


# --- the table ---------------------------------------------------------------------------------------------------

ROW_RULES: dict[OpKind, tuple[RowsFn, RowsFn]] = {
    OpKind.linear: (_linear_fwd, _linear_bwd),
    OpKind.matmul: (_matmul_fwd, _matmul_bwd),
    OpKind.bmm: (_matmul_fwd, _matmul_bwd),
    OpKind.attention: (_attention_fwd, _attention_bwd),
    OpKind.conv: (_conv_fwd, _conv_bwd),
    OpKind.softmax: (_softmax_fwd, _softmax_bwd),
    OpKind.layernorm: (_layernorm_fwd, _layernorm_bwd),
    OpKind.batchnorm: (_batchnorm_fwd, _batchnorm_bwd),
    OpKind.activation: (_elementwise_fwd, _elementwise_bwd),
    OpKind.elementwise: (_elementwise_fwd, _elementwise_bwd),
    OpKind.dropout: (_dropout_fwd, _dropout_bwd),
    OpKind.embedding: (_embedding_fwd, _embedding_bwd),
    OpKind.copy: (_copy_fwd, _copy_bwd),
    OpKind.reduction: (_memory_fwd, _memory_bwd),
    OpKind.pool: (_pool_fwd, _pool_bwd),
    OpKind.loss: (_loss_fwd, _loss_bwd),
    OpKind.rnn: (_rnn_fwd, _rnn_bwd),
    OpKind.optimizer: (_memory_fwd, _none),
    OpKind.other: (_memory_fwd, _memory_bwd),
    OpKind.view: (_none, _none),
}


def _needs_backward(node: Node) -> bool:
    return node.flops_bwd > 0 or node.bytes_read_bwd > 0


def graph_op_rows(graph: Graph, dtype: str = "fp32", mode: str | None = None, *, device: str | None = None,
                  attention_dropout: bool | None = None, fused_attention: bool = False) -> pd.DataFrame:
    """One row per kernel of every node (`ROW_RULES`), forward and, for `mode="train"`, backward, in the
    regressor's schema plus `node_id`, `node_op`, `kind`, `phase` (forward, backward) and `part` (what the row
    is: fwd, dX, dW, dbias, scores, ...). `mode` defaults to the graph's; "train" needs a training graph (the IR
    knows which nodes have a backward only there). `attention_dropout` (default: in training) says whether
    attention probabilities go through dropout: the IR does not keep dropout's p, and p = 0 runs no kernel.
    `fused_attention`: the device runs a fused SDPA node as one fused kernel (its GEMMs only, launch `FUSED`)."""
    if dtype not in DTYPES:
        raise PerfmodelError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    mode = graph.mode if mode is None else mode
    if mode not in ("train", "inference"):
        raise PerfmodelError(f"mode must be 'train' or 'inference', got {mode!r}")
    if mode == "train" and graph.mode != "train":
        raise PerfmodelError(f"graph {graph.name!r} was captured for inference: it has no backward to map; "
                             "capture it with mode='train'")
    training = mode == "train"
    ctx = Context(nodes={n.id: n for n in graph.nodes}, training=training,
                  attention_dropout=training if attention_dropout is None else attention_dropout,
                  fused_attention=fused_attention)
    records: list[dict[str, Any]] = []
    for phase in (FORWARD, BACKWARD) if training else (FORWARD,):
        nodes = graph.nodes if phase == FORWARD else reversed(graph.nodes)
        for node in nodes:
            forward, backward = ROW_RULES.get(node.kind, ROW_RULES[OpKind.other])
            if phase == BACKWARD and not _needs_backward(node):
                continue
            for row in (forward if phase == FORWARD else backward)(node, ctx):
                record: dict[str, Any] = {"node_id": node.id, "node_op": node.op, "kind": node.kind.value,
                                          "phase": phase, "part": row.part, "op_class": row.op_class,
                                          "op_name": row.op_name, "dtype": dtype, "device": device,
                                          "launch": row.launch}
                record.update({f: int(row.shape.get(f, 0)) for f in SHAPE_COLUMNS})
                records.append(record)
    rows = pd.DataFrame.from_records(records, columns=list(ROW_COLUMNS))
    for f in SHAPE_COLUMNS:
        rows[f] = rows[f].astype(np.int64)
    return rows

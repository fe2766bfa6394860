"""Analytic FLOP and byte counts for one op, from its input/output tensor metadata and its non-tensor arguments.

One table, `COST_TABLE`, maps a normalised op name (ATen `addmm`, ONNX `onnx::Gemm`) to a cost function
`(OpCall) -> (flops_fwd, flops_bwd)`; ops the table does not name fall back to a default for their kind
(`KIND_DEFAULTS`), and kinds without one (copy, view, embedding, other) cost no FLOPs. ATen and ONNX names that
compute the same thing share one cost function, so a PyTorch graph and the ONNX export of the same model count
the same FLOPs.

Conventions (exact, not measured):

* A multiply-add is 2 FLOPs. A GEMM (M,K)x(K,N) is `2*M*N*K`; a bias added by the GEMM op itself (addmm,
  linear, conv with bias, ONNX Gemm's C) is *not* counted: `Linear(K, N)` on M rows is exactly `2*M*N*K`. An
  ONNX exporter that writes the bias as a separate `Add` node does count it (one FLOP per output element, <0.1%
  of a transformer's GEMM FLOPs).
* Conv: `2 * N * Cout * Hout * Wout * (Cin/groups) * kh * kw` = `2 * numel(out) * numel(weight) / Cout`.
* Attention (SDPA): the two GEMMs `4*B*H*Lq*Lk*D` plus, per score element, 1 for the scale, 1 for an additive
  mask when there is one, and the softmax. The ONNX exporter decomposes SDPA into MatMul, Mul, Add, Softmax, ...:
  each of those nodes costs the same per element here, so both sides agree up to the exporter's bookkeeping ops.
* Element-wise ops: a per-element constant (`_PER_ELEMENT`) times numel(output): 1 for arithmetic, more for
  transcendental activations (gelu 8, silu 4, ...). Softmax 5 per element (max, sub, exp, sum, div). Layer/RMS norm
  8/6 per element; batch norm 2 per element in inference (a folded scale and shift) and 8 when it computes
  batch statistics. Reductions: numel(input). Pools: kernel elements per output element.
* Memory ops (copy, cat, gather, embedding) and shape-only ops (view kind) cost 0 FLOPs; view ops also move 0 bytes.

Backward (only when the caller says which inputs need a gradient, i.e. training graphs; inference costs 0):

* GEMM, conv, attention GEMMs: one forward-sized GEMM per operand that needs a gradient (grad input and grad
  weight: 2x forward when both do, 1x for a first layer fed by the graph input).
* Everything else: a per-op factor times forward FLOPs (`_BWD_FACTOR`: 1 for arithmetic, 2 for norms/softmax).

Bytes: forward reads every input tensor and writes every output tensor (gathers read only the rows they gather:
numel(output) plus the index tensors). Backward reads the output gradient and the saved inputs
(`bytes_written_fwd + bytes_read_fwd`) and writes the gradients of the inputs that need one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from perfmodel.core.ir import TensorMeta
from perfmodel.core.opkinds import OpKind, kind_of, normalize_op_name

DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex128": 16, "complex64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "string": 8,
}
_FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "complex128", "complex64", "float8_e4m3fn",
                           "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"})


def tensor_bytes(t: TensorMeta) -> int:
    return t.numel * DTYPE_BYTES.get(t.dtype, 4)


def is_float(t: TensorMeta) -> bool:
    return t.dtype in _FLOAT_DTYPES


@dataclass(frozen=True)
class OpCall:
    """One call of an op, as the cost functions see it.

    `inputs` are the tensor arguments in argument order (absent optional tensors skipped); `attrs` the arguments by
    name (ATen schema names with tensors as TensorMeta, or ONNX attribute names). `grad_inputs[i]` says whether
    inputs[i] needs a gradient; None means no backward pass (inference)."""

    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    grad_inputs: tuple[bool, ...] | None = None

    @property
    def out_numel(self) -> int:
        return self.outputs[0].numel if self.outputs else 0

    @property
    def in_numel(self) -> int:
        return self.inputs[0].numel if self.inputs else 0

    def needs_grad(self, i: int) -> bool:
        return self.grad_inputs is not None and i < len(self.grad_inputs) and self.grad_inputs[i]

    @property
    def any_grad(self) -> bool:
        return self.grad_inputs is not None and any(self.grad_inputs)


@dataclass(frozen=True)
class OpCost:
    flops_fwd: int = 0
    flops_bwd: int = 0
    bytes_read_fwd: int = 0
    bytes_written_fwd: int = 0
    bytes_read_bwd: int = 0
    bytes_written_bwd: int = 0


CostFn = Callable[[OpCall], tuple[int, int]]  # -> (flops_fwd, flops_bwd when training)


# --- cost functions ----------------------------------------------------------------------------------------------


def _no_flops(call: OpCall) -> tuple[int, int]:
    return 0, 0


def _gemm(a: int, b: int, *, onnx_gemm: bool = False) -> CostFn:
    """A GEMM of inputs[a] (..., M, K) by inputs[b] (..., K, N), broadcasting: 2 * numel(out) * K. Backward: one
    forward-sized GEMM per operand that needs a gradient."""

    def cost(call: OpCall) -> tuple[int, int]:
        if len(call.inputs) <= max(a, b) or not call.outputs:
            return 0, 0
        shape = call.inputs[a].shape
        if onnx_gemm and call.attrs.get("transA"):
            k = shape[0]
        else:
            k = shape[-1] if shape else 1
        flops = 2 * call.out_numel * k
        return flops, flops * (call.needs_grad(a) + call.needs_grad(b))

    return cost


def _conv(call: OpCall) -> tuple[int, int]:
    """2 * numel(out) * (Cin/groups * kh * kw); weight is (Cout, Cin/groups, *kernel). Transposed: the same
    product with input and output swapped, weight (Cin, Cout/groups, *kernel)."""
    if len(call.inputs) < 2 or not call.outputs:
        return 0, 0
    if call.attrs.get("transposed"):
        return _conv_transpose(call)
    w = call.inputs[1]
    flops = 2 * call.out_numel * (w.numel // w.shape[0])
    return flops, flops * (call.needs_grad(0) + call.needs_grad(1))


def conv_dilation(call: OpCall) -> int:
    """The largest dilation of a convolution call (ATen `dilation`, ONNX `dilations`), 1 when it has none."""
    value = call.attrs.get("dilation", call.attrs.get("dilations"))
    values = value if isinstance(value, (list, tuple)) else [value] if isinstance(value, int) else []
    return max([int(v) for v in values if isinstance(v, int) and v >= 1], default=1)


def sdpa_causal(call: OpCall) -> bool:
    """A fused attention call with `is_causal=True` (what Hugging Face's `sdpa` attention passes a causal language
    model without a padding mask)."""
    return call.attrs.get("is_causal") is True


def einsum_equation(call: OpCall) -> str | None:
    """An einsum call's equation without spaces (ATen `einsum` and ONNX `Einsum` carry it as `equation`; no other op
    has that argument), None for every other call."""
    equation = call.attrs.get("equation")
    return equation.replace(" ", "") if isinstance(equation, str) and equation.strip() else None


def _conv_transpose(call: OpCall) -> tuple[int, int]:
    if len(call.inputs) < 2:
        return 0, 0
    x, w = call.inputs[0], call.inputs[1]
    flops = 2 * x.numel * (w.numel // w.shape[0])
    return flops, flops * (call.needs_grad(0) + call.needs_grad(1))


def _sdpa(call: OpCall) -> tuple[int, int]:
    """q (..., Lq, D), k (..., Lk, D), v (..., Lk, Dv) -> (..., Lq, Dv): QK^T and PV GEMMs, the scale, the mask
    add when a mask is given, and the softmax over (..., Lq, Lk)."""
    if len(call.inputs) < 3 or not call.outputs:
        return 0, 0
    q, k = call.inputs[0], call.inputs[1]
    out = call.outputs[0]
    lq, d, lk, dv = q.shape[-2], q.shape[-1], k.shape[-2], out.shape[-1]
    batch = out.numel // (lq * dv)
    scores = batch * lq * lk
    gemm_flops = 2 * scores * d + 2 * scores * dv
    has_mask = len(call.inputs) > 3 and call.attrs.get("attn_mask") is not None
    pointwise = scores * (1 + has_mask + _PER_ELEMENT["softmax"])
    return gemm_flops + pointwise, 2 * gemm_flops + 2 * pointwise if call.any_grad else 0


def _einsum(call: OpCall) -> tuple[int, int]:
    """2 * product of the sizes of every distinct index (a contraction of two operands)."""
    equation = str(call.attrs.get("equation", "")).replace(" ", "")
    lhs = equation.split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for term, t in zip(lhs, call.inputs):
        letters = [c for c in term if c.isalpha()]  # aligned from the right: `...` covers the leading dims
        for letter, dim in zip(reversed(letters), reversed(t.shape)):
            sizes[letter] = max(sizes.get(letter, 1), dim)
    flops = 2 * math.prod(sizes.values()) if len(call.inputs) > 1 else call.in_numel
    return flops, flops * sum(call.needs_grad(i) for i in range(len(call.inputs)))


def _rnn_flops(tokens: int, weights: list[TensorMeta]) -> int:
    """Every token goes through every weight matrix once: 2 * tokens * numel(weight matrices)."""
    return 2 * tokens * sum(w.numel for w in weights if len(w.shape) >= 2)


def _rnn_aten(call: OpCall) -> tuple[int, int]:
    """aten.lstm / gru (input, hx, params, ...): params hold every layer's and direction's weight matrices, and
    every layer and direction runs every token through its own matrices, so this is exact for the GEMMs (the
    gates' element-wise work is not counted)."""
    x = call.attrs.get("input") or call.attrs.get("data")
    params = call.attrs.get("params") or []
    if not isinstance(x, TensorMeta) or not x.shape:
        return 0, 0
    flops = _rnn_flops(x.numel // x.shape[-1], [p for p in params if isinstance(p, TensorMeta)])
    return flops, 2 * flops if call.any_grad else 0


def _rnn_onnx(call: OpCall) -> tuple[int, int]:
    """ONNX LSTM / GRU / RNN (X (T, B, I), W, R, ...): one layer, both directions in W and R."""
    if len(call.inputs) < 3:
        return 0, 0
    x = call.inputs[0]
    flops = _rnn_flops(x.numel // x.shape[-1], [call.inputs[1], call.inputs[2]])
    return flops, 2 * flops if call.any_grad else 0


def _pool(call: OpCall) -> tuple[int, int]:
    """Kernel elements per output element; adaptive / global pools: numel(input) (each input read once)."""
    kernel = call.attrs.get("kernel_size") or call.attrs.get("kernel_shape")
    if kernel:
        kernel = [kernel] * 2 if isinstance(kernel, int) else list(kernel)
        flops = call.out_numel * math.prod(kernel)
    else:
        flops = call.in_numel
    return flops, flops if call.any_grad else 0


def _reduction(call: OpCall) -> tuple[int, int]:
    flops = call.in_numel
    return flops, flops if call.any_grad else 0


def _per_element(name: str) -> CostFn:
    """`_PER_ELEMENT[name]` FLOPs per output element forward, `_BWD_FACTOR` times that backward."""
    per_element = _PER_ELEMENT[name]
    bwd_factor = _BWD_FACTOR.get(name, 1)

    def cost(call: OpCall) -> tuple[int, int]:
        flops = per_element * call.out_numel
        return flops, bwd_factor * flops if call.any_grad else 0

    return cost


def _batch_norm(call: OpCall) -> tuple[int, int]:
    """Batch statistics (training) cost like a layer norm; running statistics fold into a scale and a shift."""
    training = call.attrs.get("training", call.attrs.get("training_mode", False))  # ATen / ONNX
    return (_BATCH_NORM_TRAIN if training else _BATCH_NORM_EVAL)(call)


def _dropout(call: OpCall) -> tuple[int, int]:
    """A random mask and a scaled multiply while training (`train=True`); the identity in inference."""
    if not call.attrs.get("train", True):
        return 0, 0
    flops = _PER_ELEMENT["dropout"] * call.out_numel
    return flops, flops // 2 if call.any_grad else 0


def _loss(call: OpCall) -> tuple[int, int]:
    """Cross entropy / NLL / MSE: a few FLOPs per element of the prediction (softmax + pick + mean)."""
    flops = _PER_ELEMENT["loss"] * call.in_numel
    return flops, flops if call.any_grad else 0


# FLOPs per output element of point-wise ops (and per element of norms/softmax).
_PER_ELEMENT: dict[str, int] = {
    "arith": 1,  # add, mul, where, compare, relu, ...
    "transcendental": 4,  # exp, log, erf, tanh, sigmoid, sqrt-like
    "gelu": 8,  # 0.5 * x * (1 + erf(x / sqrt(2)))
    "silu": 5,  # x * sigmoid(x)
    "hardswish": 4,
    "softplus": 6,
    "mish": 10,
    "softmax": 5,  # max, subtract, exp, sum, divide
    "layer_norm": 8,  # mean, subtract, square, mean, rsqrt, multiply, scale, shift
    "rms_norm": 6,  # square, mean, rsqrt, multiply, scale
    "group_norm": 8,
    "batch_norm_train": 8,
    "batch_norm_eval": 2,
    "dropout": 2,
    "loss": 4,
}
_BWD_FACTOR: dict[str, int] = {
    "arith": 1, "transcendental": 2, "gelu": 2, "silu": 2, "hardswish": 1, "softplus": 2, "mish": 2, "softmax": 2,
    "layer_norm": 2, "rms_norm": 2, "group_norm": 2, "batch_norm_train": 2, "batch_norm_eval": 1,
}

_BATCH_NORM_TRAIN = _per_element("batch_norm_train")
_BATCH_NORM_EVAL = _per_element("batch_norm_eval")

COST_TABLE: dict[str, CostFn] = {}


def _register(cost: CostFn, *names: str) -> None:
    for name in names:
        COST_TABLE[name] = cost


_register(_gemm(0, 1), "linear", "mm", "bmm", "matmul", "mv", "dot", "onnx::MatMul", "onnx::MatMulInteger",
          "onnx::FusedMatMul")
_register(_gemm(1, 2), "addmm", "_addmm_activation", "baddbmm", "addmv")
_register(_gemm(0, 1, onnx_gemm=True), "onnx::Gemm")
_register(_conv, "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "mkldnn_convolution",
          "cudnn_convolution", "_slow_conv2d_forward", "thnn_conv2d", "conv_depthwise2d", "_conv_depthwise2d",
          "miopen_convolution", "miopen_depthwise_convolution", "_nnpack_spatial_convolution", "onnx::Conv",
          "onnx::QLinearConv")
_register(_conv_transpose, "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "onnx::ConvTranspose")
_register(_sdpa, "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
          "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
          "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward")
_register(_einsum, "einsum", "onnx::Einsum")
_register(_rnn_aten, "lstm", "gru", "rnn_tanh", "rnn_relu")
_register(_rnn_onnx, "onnx::LSTM", "onnx::GRU", "onnx::RNN")
_register(_pool, "max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "avg_pool1d", "avg_pool2d",
          "avg_pool3d", "mkldnn_max_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "_adaptive_avg_pool2d",
          "_adaptive_avg_pool3d", "adaptive_max_pool2d", "onnx::MaxPool", "onnx::AveragePool",
          "onnx::GlobalAveragePool", "onnx::GlobalMaxPool")
_register(_reduction, "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std", "var_mean",
          "norm", "linalg_vector_norm", "prod", "logsumexp", "cumsum", "onnx::ReduceMean", "onnx::ReduceSum",
          "onnx::ReduceMax", "onnx::ReduceMin", "onnx::ReduceProd", "onnx::ReduceL2", "onnx::ArgMax",
          "onnx::ArgMin", "onnx::CumSum")
_register(_per_element("transcendental"), "exp", "log", "erf", "sin", "cos", "tanh", "sigmoid", "sqrt", "rsqrt",
          "log1p", "expm1", "pow", "hardsigmoid", "elu", "selu", "onnx::Exp", "onnx::Log", "onnx::Erf",
          "onnx::Sin", "onnx::Cos", "onnx::Tanh", "onnx::Sigmoid", "onnx::Sqrt", "onnx::Pow",
          "onnx::HardSigmoid", "onnx::Elu", "onnx::Selu")
_register(_per_element("gelu"), "gelu", "onnx::Gelu", "onnx::FastGelu", "onnx::BiasGelu", "onnx::QuickGelu")
_register(_per_element("silu"), "silu")
_register(_per_element("hardswish"), "hardswish", "onnx::HardSwish")
_register(_per_element("softplus"), "softplus", "onnx::Softplus")
_register(_per_element("mish"), "mish", "onnx::Mish")
_register(_per_element("softmax"), "softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax",
          "onnx::Softmax", "onnx::LogSoftmax")
_register(_per_element("layer_norm"), "layer_norm", "native_layer_norm", "onnx::LayerNormalization",
          "onnx::SkipLayerNormalization")
_register(_per_element("rms_norm"), "rms_norm", "_fused_rms_norm", "onnx::RMSNormalization",
          "onnx::SimplifiedLayerNormalization", "onnx::SkipSimplifiedLayerNormalization")
_register(_per_element("group_norm"), "group_norm", "native_group_norm", "instance_norm",
          "onnx::GroupNormalization", "onnx::InstanceNormalization")
_register(_batch_norm, "batch_norm", "native_batch_norm", "_native_batch_norm_legit",
          "_native_batch_norm_legit_functional", "cudnn_batch_norm", "miopen_batch_norm", "_batch_norm_impl_index",
          "_batch_norm_with_update", "onnx::BatchNormalization")
_register(_BATCH_NORM_EVAL, "_native_batch_norm_legit_no_training", "_batch_norm_no_update")
_register(_dropout, "dropout", "native_dropout", "feature_dropout", "alpha_dropout", "_fused_dropout")
_register(_loss, "cross_entropy_loss", "nll_loss", "nll_loss_forward", "nll_loss2d_forward", "mse_loss",
          "binary_cross_entropy_with_logits", "binary_cross_entropy", "onnx::SoftmaxCrossEntropyLoss",
          "onnx::NegativeLogLikelihoodLoss")
# Ops that create or fill tensors, or only select, without arithmetic on their inputs; ONNX Dropout (ONNX graphs
# are inference graphs, where dropout is the identity).
_register(_no_flops, "arange", "full", "ones_like", "zeros_like", "full_like", "fill", "zero", "empty_like",
          "scalar_tensor", "lift_fresh_copy", "triu", "tril", "onnx::Range", "onnx::ConstantOfShape",
          "onnx::Trilu", "onnx::Dropout")

# Kinds whose ops the table does not name: their cost by kind.
KIND_DEFAULTS: dict[OpKind, CostFn] = {
    OpKind.elementwise: _per_element("arith"),
    OpKind.activation: _per_element("arith"),  # relu, leaky_relu, hardtanh, ... (transcendental ones are named)
    OpKind.softmax: _per_element("softmax"),
    OpKind.layernorm: _per_element("layer_norm"),
    OpKind.batchnorm: _batch_norm,
    OpKind.pool: _pool,
    OpKind.reduction: _reduction,
    OpKind.dropout: _dropout,
    OpKind.loss: _loss,
    OpKind.linear: _gemm(0, 1),
    OpKind.matmul: _gemm(0, 1),
    OpKind.bmm: _gemm(0, 1),
    OpKind.conv: _conv,
    OpKind.attention: _sdpa,
}

# Ops that read only the rows they gather: numel(output) plus their index tensors, not the whole source tensor.
_GATHERS = frozenset({"embedding", "embedding_bag", "_embedding_bag", "index", "_unsafe_index", "index_select",
                      "gather", "onnx::Gather", "onnx::GatherElements", "onnx::GatherND"})


def op_cost(op: str, call: OpCall, kind: OpKind | None = None) -> OpCost:
    """FLOPs and bytes of one op call, forward and (when `call.grad_inputs` says some input needs one) backward."""
    name = normalize_op_name(op)
    kind = kind if kind is not None else kind_of(name)
    if kind == OpKind.view:
        return OpCost()
    cost_fn = COST_TABLE.get(name) or KIND_DEFAULTS.get(kind, _no_flops)
    flops_fwd, flops_bwd = cost_fn(call)
    bytes_written = sum(tensor_bytes(t) for t in call.outputs)
    if name in _GATHERS:
        bytes_read = bytes_written + sum(tensor_bytes(t) for t in call.inputs if not is_float(t))
    else:
        bytes_read = sum(tensor_bytes(t) for t in call.inputs)
    backward = call.any_grad and any(is_float(t) for t in call.outputs)
    if not backward:
        return OpCost(flops_fwd, 0, bytes_read, bytes_written)
    grad_bytes = sum(tensor_bytes(t) for t, g in zip(call.inputs, call.grad_inputs or ()) if g)
    return OpCost(flops_fwd, flops_bwd, bytes_read, bytes_written, bytes_read + bytes_written, grad_bytes)

"""Canonical op kinds: one table from framework op names (ATen, ONNX) to the kind perfmodel reasons about.

Names are normalised before look-up: `aten::addmm`, `aten.addmm.default` and `addmm_` all become `addmm`; ONNX ops
are looked up as `onnx::Gemm`. Unknown names map to `other`.
"""

from __future__ import annotations

from enum import Enum


class OpKind(str, Enum):
    conv = "conv"
    linear = "linear"  # GEMM with a weight: addmm, linear, ONNX Gemm
    matmul = "matmul"  # 2-D GEMM between activations (mm, matmul)
    bmm = "bmm"  # batched GEMM
    attention = "attention"  # fused scaled-dot-product attention
    elementwise = "elementwise"  # arithmetic: add, mul, div, pow, ...
    activation = "activation"  # relu, gelu, silu, tanh, sigmoid, ...
    softmax = "softmax"
    layernorm = "layernorm"  # layer norm and RMS norm
    batchnorm = "batchnorm"  # batch, group and instance norm
    pool = "pool"
    reduction = "reduction"  # sum, mean, max over dims
    embedding = "embedding"
    rnn = "rnn"  # fused LSTM / GRU
    dropout = "dropout"
    loss = "loss"
    copy = "copy"  # data movement that touches memory: cat, clone, contiguous, to, index, pad
    view = "view"  # shape-only ops: view, reshape, transpose, permute, slice (no memory traffic)
    optimizer = "optimizer"  # fused/foreach optimizer updates
    other = "other"


_K = OpKind
_TABLE: dict[str, OpKind] = {}


def _add(kind: OpKind, *names: str) -> None:
    for name in names:
        _TABLE[name] = kind


# --- ATen, forward ---
_add(_K.conv, "convolution", "conv1d", "conv2d", "conv3d", "_convolution", "mkldnn_convolution",
     "cudnn_convolution", "conv_transpose2d", "_slow_conv2d_forward", "thnn_conv2d", "conv_depthwise2d",
     "_conv_depthwise2d", "miopen_convolution", "miopen_depthwise_convolution", "_nnpack_spatial_convolution")
_add(_K.linear, "addmm", "linear", "_addmm_activation")
_add(_K.matmul, "mm", "matmul", "addmv", "mv", "dot")
_add(_K.bmm, "bmm", "baddbmm", "einsum")
_add(_K.attention, "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
     "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
     "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward")
_add(_K.elementwise, "add", "sub", "mul", "div", "pow", "rsub", "neg", "sqrt", "rsqrt", "exp", "log", "abs",
     "reciprocal", "addcmul", "addcdiv", "lerp", "fill", "zero", "masked_fill", "where", "clamp", "clamp_min",
     "clamp_max", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "bitwise_not", "bitwise_and",
     "bitwise_or", "logical_not", "sign", "floor", "ceil", "round", "remainder", "fmod", "sin", "cos", "erf",
     "square", "log1p", "expm1", "triu", "tril", "cumsum", "arange", "full", "ones_like", "zeros_like",
     "full_like", "rand_like", "bernoulli", "scalar_tensor", "lift_fresh_copy", "add_scalar", "mul_scalar")
_add(_K.activation, "relu", "relu6", "gelu", "silu", "tanh", "sigmoid", "hardswish", "hardsigmoid", "hardtanh",
     "leaky_relu", "elu", "selu", "softplus", "mish", "threshold", "glu", "prelu", "_prelu_kernel")
_add(_K.softmax, "softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax")
_add(_K.layernorm, "layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm")
_add(_K.batchnorm, "batch_norm", "native_batch_norm", "_native_batch_norm_legit",
     "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional", "cudnn_batch_norm",
     "miopen_batch_norm", "_batch_norm_impl_index", "_batch_norm_with_update", "_batch_norm_no_update",
     "group_norm", "native_group_norm", "instance_norm")
_add(_K.pool, "max_pool2d", "max_pool2d_with_indices", "avg_pool2d", "adaptive_avg_pool2d",
     "_adaptive_avg_pool2d", "adaptive_max_pool2d", "max_pool1d", "avg_pool1d", "mkldnn_max_pool2d",
     "max_pool3d", "avg_pool3d", "_adaptive_avg_pool3d", "adaptive_avg_pool1d")
_add(_K.reduction, "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std", "var_mean",
     "norm", "linalg_vector_norm", "prod", "any", "all", "logsumexp")
_add(_K.embedding, "embedding", "embedding_bag", "_embedding_bag")
_add(_K.rnn, "lstm", "gru", "rnn_tanh", "rnn_relu", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
     "mkldnn_rnn_layer", "_cudnn_rnn", "miopen_rnn", "lstm_cell", "gru_cell")
_add(_K.dropout, "dropout", "native_dropout", "feature_dropout", "alpha_dropout", "_fused_dropout")
_add(_K.loss, "cross_entropy_loss", "nll_loss", "nll_loss_forward", "nll_loss2d_forward", "mse_loss",
     "binary_cross_entropy_with_logits", "binary_cross_entropy")
_add(_K.copy, "cat", "stack", "clone", "contiguous", "copy", "_to_copy", "to", "index", "index_select", "gather",
     "scatter", "scatter_add", "index_put", "_index_put_impl", "pad", "constant_pad_nd", "reflection_pad2d",
     "repeat", "roll", "flip", "masked_select", "_unsafe_index", "upsample_nearest2d", "upsample_bilinear2d",
     "channel_shuffle", "native_channel_shuffle", "pixel_shuffle", "tile", "embedding_renorm", "empty_like",
     "new_zeros", "new_ones", "new_empty_strided", "_pack_padded_sequence", "one_hot", "type_as", "_copy_from",
     "_copy_from_and_resize", "resize")
_add(_K.view, "view", "reshape", "_reshape_alias", "_unsafe_view", "transpose", "t", "permute", "expand",
     "expand_as", "unsqueeze", "squeeze", "flatten", "unflatten", "slice", "select", "narrow", "split",
     "split_with_sizes", "chunk", "unbind", "as_strided", "alias", "detach", "view_as", "unfold", "getitem",
     "numel", "size", "sym_size", "stride", "empty", "empty_strided", "zeros", "ones", "movedim", "swapaxes",
     "result_type", "item", "_local_scalar_dense", "lift_fresh", "set_", "_has_compatible_shallow_copy_type",
     "is_nonzero", "_assert_tensor_metadata", "_assert_async", "resolve_conj", "resolve_neg", "_unsafe_view")
# Added with the FLOP table (ops seen in zoo graphs).
_add(_K.elementwise, "__and__", "__or__", "__xor__", "__invert__", "diff", "logical_and", "logical_or",
     "isnan", "isinf", "nan_to_num", "xlogy")
_add(_K.view, "new_empty")
_add(_K.optimizer, "_foreach_add", "_foreach_mul", "_foreach_addcmul", "_foreach_addcdiv", "_foreach_lerp",
     "_foreach_sqrt", "_foreach_div", "_foreach_mul_", "_foreach_add_", "_foreach_sub", "_foreach_maximum",
     "_foreach_neg", "_fused_adam", "_fused_adamw", "_fused_sgd", "_foreach_copy", "_foreach_pow",
     "_foreach_reciprocal", "_foreach_addcdiv_", "_foreach_sign")
# unmapped names seen in real profiles (zoo models, train and inference, torch 2.13 CPU)
_add(_K.attention, "_scaled_dot_product_attention_math")
_add(_K.elementwise, "isneginf", "isposinf")
_add(_K.view, "cudnn_is_acceptable", "unsafe_chunk", "unsafe_split", "unsafe_split_with_sizes")
# --- ATen, backward ---
_add(_K.conv, "convolution_backward", "mkldnn_convolution_backward", "cudnn_convolution_backward",
     "thnn_conv2d_backward", "_slow_conv2d_backward", "conv_depthwise2d_backward", "miopen_convolution_backward")
_add(_K.activation, "threshold_backward", "gelu_backward", "silu_backward", "tanh_backward", "sigmoid_backward",
     "hardswish_backward", "hardsigmoid_backward", "hardtanh_backward", "leaky_relu_backward", "elu_backward",
     "glu_backward", "softplus_backward", "relu6_backward", "mish_backward")
_add(_K.softmax, "_softmax_backward_data", "_log_softmax_backward_data")
_add(_K.layernorm, "native_layer_norm_backward", "_fused_rms_norm_backward")
_add(_K.batchnorm, "native_batch_norm_backward", "cudnn_batch_norm_backward", "miopen_batch_norm_backward",
     "native_group_norm_backward", "batch_norm_backward")
_add(_K.pool, "max_pool2d_with_indices_backward", "avg_pool2d_backward", "_adaptive_avg_pool2d_backward",
     "adaptive_max_pool2d_backward", "mkldnn_max_pool2d_backward", "max_pool3d_with_indices_backward")
_add(_K.embedding, "embedding_backward", "embedding_dense_backward", "_embedding_bag_backward",
     "_embedding_bag_dense_backward", "embedding_sparse_backward")
_add(_K.attention, "_scaled_dot_product_flash_attention_backward",
     "_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_efficient_attention_backward",
     "_scaled_dot_product_cudnn_attention_backward", "_flash_attention_backward", "_efficient_attention_backward")
_add(_K.rnn, "mkldnn_rnn_layer_backward", "_cudnn_rnn_backward", "miopen_rnn_backward",
     "_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_gru_cell_backward", "_thnn_differentiable_lstm_cell_backward")
_add(_K.dropout, "native_dropout_backward")
_add(_K.loss, "nll_loss_backward", "nll_loss2d_backward", "mse_loss_backward",
     "binary_cross_entropy_with_logits_backward")
_add(_K.copy, "index_add", "index_put_", "select_backward", "slice_backward", "index_select_backward",
     "gather_backward", "constant_pad_nd_backward", "upsample_nearest2d_backward", "upsample_bilinear2d_backward",
     "unfold_backward", "cat_backward")
_add(_K.elementwise, "div_backward", "pow_backward", "mul_backward", "masked_fill_backward", "where_backward")
# --- ONNX ---
_add(_K.conv, "onnx::Conv", "onnx::ConvTranspose", "onnx::QLinearConv")
_add(_K.linear, "onnx::Gemm")
_add(_K.matmul, "onnx::MatMul", "onnx::MatMulInteger", "onnx::FusedMatMul")
_add(_K.bmm, "onnx::Einsum")
_add(_K.attention, "onnx::Attention", "onnx::MultiHeadAttention")
_add(_K.elementwise, "onnx::Add", "onnx::Sub", "onnx::Mul", "onnx::Div", "onnx::Pow", "onnx::Sqrt",
     "onnx::Reciprocal", "onnx::Neg", "onnx::Exp", "onnx::Log", "onnx::Abs", "onnx::Erf", "onnx::Where",
     "onnx::Equal", "onnx::Less", "onnx::Greater", "onnx::Not", "onnx::And", "onnx::Or", "onnx::Clip",
     "onnx::Max", "onnx::Min", "onnx::Sin", "onnx::Cos", "onnx::Floor", "onnx::Ceil", "onnx::Mod", "onnx::Sum",
     "onnx::CumSum", "onnx::Trilu", "onnx::Range", "onnx::ConstantOfShape", "onnx::IsNaN", "onnx::BiasGelu")
_add(_K.activation, "onnx::Relu", "onnx::Gelu", "onnx::Tanh", "onnx::Sigmoid", "onnx::HardSwish",
     "onnx::HardSigmoid", "onnx::LeakyRelu", "onnx::Elu", "onnx::Selu", "onnx::Softplus", "onnx::PRelu",
     "onnx::Mish", "onnx::FastGelu", "onnx::QuickGelu")
_add(_K.softmax, "onnx::Softmax", "onnx::LogSoftmax")
_add(_K.layernorm, "onnx::LayerNormalization", "onnx::SimplifiedLayerNormalization", "onnx::RMSNormalization",
     "onnx::SkipLayerNormalization", "onnx::SkipSimplifiedLayerNormalization", "onnx::EmbedLayerNormalization")
_add(_K.batchnorm, "onnx::BatchNormalization", "onnx::GroupNormalization", "onnx::InstanceNormalization")
_add(_K.pool, "onnx::MaxPool", "onnx::AveragePool", "onnx::GlobalAveragePool", "onnx::GlobalMaxPool")
_add(_K.reduction, "onnx::ReduceMean", "onnx::ReduceSum", "onnx::ReduceMax", "onnx::ReduceMin",
     "onnx::ReduceProd", "onnx::ReduceL2", "onnx::ArgMax", "onnx::ArgMin")
_add(_K.embedding, "onnx::Gather")
_add(_K.rnn, "onnx::LSTM", "onnx::GRU", "onnx::RNN")
_add(_K.dropout, "onnx::Dropout")
_add(_K.loss, "onnx::SoftmaxCrossEntropyLoss", "onnx::NegativeLogLikelihoodLoss")
_add(_K.copy, "onnx::Concat", "onnx::Pad", "onnx::Tile", "onnx::Expand", "onnx::GatherElements",
     "onnx::GatherND", "onnx::ScatterND", "onnx::ScatterElements", "onnx::Resize", "onnx::Cast",
     "onnx::Identity", "onnx::Split", "onnx::Slice", "onnx::Transpose", "onnx::ReorderInput",
     "onnx::ReorderOutput")
_add(_K.view, "onnx::Reshape", "onnx::Flatten", "onnx::Squeeze", "onnx::Unsqueeze", "onnx::Shape",
     "onnx::Constant", "onnx::Size")


def normalize_op_name(name: str) -> str:
    """`aten::addmm`, `aten.addmm.default`, `addmm_`, `aten::add_.Tensor` -> `addmm` / `add`; ONNX names keep
    their `onnx::` prefix (`Gemm` alone is accepted too via `kind_of_onnx`)."""
    if name.startswith("onnx::"):
        return name
    for prefix in ("aten::", "aten.", "prims::", "prims."):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    name = name.split(".", 1)[0]
    if name.endswith("_") and not name.startswith("_foreach") and name not in _TABLE:
        name = name[:-1]
    return name


def kind_of(name: str) -> OpKind:
    """The canonical kind of a framework op name; `other` when the table does not know it."""
    return _TABLE.get(normalize_op_name(name), OpKind.other)


def kind_of_onnx(op_type: str, domain: str = "") -> OpKind:
    """The canonical kind of an ONNX node (any domain: com.microsoft fused ops share the table)."""
    return _TABLE.get(f"onnx::{op_type}", OpKind.other)

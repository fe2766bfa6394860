"""The graph of an ONNX model: one Node per ONNX node, shapes from ONNX shape inference, costs from the same
FLOP table as PyTorch graphs (`perfmodel.graph.flops`), for inference or for training.

A training graph (`mode="train"`) is the file's forward graph with backward costs derived the way
`perfmodel.graph.from_torch` derives them, through the same `op_cost`: the trainable parameters are the float
initializers (minus the inputs an op does not differentiate, `NON_DIFFERENTIABLE_INPUTS`: batch norm's running
statistics, index and shape operands), a value needs a gradient when it is a trainable parameter or a float output
of a node with an input that needs one, and each node's OpCall says which of its inputs need a gradient. The
optimizer step and autocast casts are added from the graph's parameter count by the predictor, as for a torch
graph. The file holds the inference form of the model, so a training graph also
- runs `BatchNormalization` on batch statistics (`training_mode` 1), as a training step does;
- keeps no constant-only work: constant subgraphs (the zero conv biases and shape arithmetic of an unoptimised
  dynamo export) are folded first, as ONNX Runtime would (`onnxscript.optimizer.fold_constants`; the trained
  parameters are inputs of a step, never folded), and a copy op of parameters alone (a weight's `Transpose`) is a
  view, as `weight.t()` is in PyTorch; so are `Transpose` and `Identity` of activations (`transpose`, `permute`
  and `clone` are views in eager PyTorch);
- reads a linear layer as torch's `linear` (`_linear_layers`): a MatMul by a weight (or its Transpose) plus the
  Add of its bias, or a Gemm by a weight, is one `linear` node with the weight in torch's (N, K) layout.
What the inference export removed cannot come back: dropout (the identity in eval, so not exported) and batch
norms folded into their convolutions by the exporter's optimiser (`torch.onnx.export(..., dynamo=True)` folds them
unless `optimize=False`). Export with `optimize=False` for training predictions of models with batch norm.
`bench/onnx_train.py` compares such predictions with the torch capture's on zoo models.

Symbolic dimensions of the graph inputs (and outputs) are fixed before shape inference, by name first:

* a name containing `batch` (or exactly `n`, `b`, `N`, `B`) -> `batch_size`;
* a name containing `seq`, `len`, `token`, `time` or `step` -> `seq_len`;
* any other symbolic dimension on the first axis -> `batch_size`;
* anything else is an error naming the dimension.

`batch_size` defaults to 1 and `seq_len` to the job default (128) when not given. Static dimensions are kept as
the file has them. Dimensions that shape inference still cannot resolve count as 1.

Parameters are the floating-point initializers (integer initializers are shape and index constants). Control
flow subgraphs (If, Loop, Scan) are not descended into: those nodes cost nothing here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfmodel.core.errors import JobLoadError, PerfmodelError
from perfmodel.core.ir import Graph, GraphTotals, Node, TensorMeta
from perfmodel.core.opkinds import OpKind, kind_of_onnx
from perfmodel.graph.flops import OpCall, conv_dilation, einsum_equation, is_float, op_cost, tensor_bytes
from perfmodel.jobs.spec import DEFAULT_SEQ_LEN

# onnx.TensorProto.DataType -> torch-style dtype name
_ONNX_DTYPES: dict[int, str] = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 8: "string", 9: "bool",
    10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128", 16: "bfloat16",
    17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz",
}
_BATCH_NAMES = ("batch",)
_EXACT_BATCH_NAMES = frozenset({"n", "b"})
_SEQ_NAMES = ("seq", "len", "token", "time", "step")


def graph_from_onnx(path: str | Path, *, batch_size: int | None = None, seq_len: int | None = None,
                    name: str | None = None, mode: str = "inference") -> Graph:
    """Load, check and shape-infer an ONNX file and build its graph: inference, or `mode="train"` with derived
    backward costs (module docstring). Any problem with the file itself (missing, truncated, not ONNX, fails the
    checker) raises a one-line JobLoadError (a PerfmodelError)."""
    import onnx

    if mode not in ("train", "inference"):
        raise PerfmodelError(f"graph mode must be 'train' or 'inference', got {mode!r}")
    path = Path(path)
    model = _load_checked(path)
    exported = _static_batch(model)
    if batch_size is not None and exported is not None and exported != batch_size:
        raise JobLoadError(f"{path.name}: every input shape is fixed (exported at batch {exported}, the inputs' first "
                           f"dimension), so batch {batch_size} cannot be priced from it: ask for batch {exported}, or "
                           f"export the model with a dynamic batch axis")
    _fix_symbolic_dims(model, batch_size or 1, seq_len or DEFAULT_SEQ_LEN)
    try:
        if model.functions:
            import onnx.inliner

            model = onnx.inliner.inline_local_functions(model)
        trainable = _trainable(model) if mode == "train" else None
        if trainable:  # only the parameters' names, types and shapes are read from here on
            for init in model.graph.initializer:
                if init.name in trainable:
                    for data_field in _DATA_FIELDS:
                        init.ClearField(data_field)
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        if trainable is not None:  # folding needs the inferred types; the folded graph is inferred again
            model = onnx.shape_inference.infer_shapes(_fold_constants(model, trainable), strict_mode=False,
                                                      data_prop=True)
    except Exception as exc:  # inference errors come from C++ with long messages: keep the first line
        raise JobLoadError(f"ONNX shape inference failed for {path}: {_first_line(exc)}") from None
    graph = _build(model, name=name or path.stem, trainable=trainable)
    return graph.model_copy(update={"batch_size": batch_size or exported})


_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")
# Constant subgraphs folded up to this many elements per tensor (zero biases, shapes; never the weights, which
# are read without their data).
FOLD_LIMIT_ELEMENTS = 1 << 16


def _fold_constants(model: Any, trainable: frozenset[str]) -> Any:
    """The model with its constant subgraphs folded, in place (what ONNX Runtime runs once at load, not per step).
    The trained parameters (their values already dropped: a graph needs their shapes only) are inputs of a training
    step, not constants: nothing is folded into them (a weight's Transpose stays a node, and the embedding rows a
    Gather of constant positions reads stay a parameter). onnxscript logs each fold it skips: quietened."""
    import logging

    import onnx
    from onnxscript.optimizer import fold_constants

    folded = model  # folded in place: the caller loaded it for this graph alone
    kept = [init for init in folded.graph.initializer if init.name in trainable]
    others = [init for init in folded.graph.initializer if init.name not in trainable]
    del folded.graph.initializer[:]
    folded.graph.initializer.extend(others)
    as_inputs = [onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)) for init in kept]
    folded.graph.input.extend(as_inputs)
    logger = logging.getLogger("onnxscript")
    level, logger.level = logger.level, logging.CRITICAL
    try:
        fold_constants(folded, input_size_limit=FOLD_LIMIT_ELEMENTS, output_size_limit=FOLD_LIMIT_ELEMENTS)
    finally:
        logger.setLevel(level)
    names = {init.name for init in kept}
    inputs = [value for value in folded.graph.input if value.name not in names]
    del folded.graph.input[:]
    folded.graph.input.extend(inputs)
    folded.graph.initializer.extend(kept)
    return folded


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _load_checked(path: Path) -> Any:
    import onnx

    if not path.is_file():
        raise JobLoadError(f"ONNX file not found: {path}")
    try:
        # Weights stored outside the file are not needed: initializers keep their dims without their data.
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends: never show their traceback
        raise JobLoadError(f"{path} is not a readable ONNX model ({_first_line(exc)})") from None
    if not model.graph.node:
        raise JobLoadError(f"{path} is not an ONNX model (it holds no graph nodes)")
    try:
        onnx.checker.check_model(str(path))  # by path: works for models over 2 GB and with external data
    except Exception as exc:
        raise JobLoadError(f"{path} is not a valid ONNX model ({_first_line(exc)})") from None
    return model


def _dim_value(dim_name: str, axis: int, batch_size: int, seq_len: int) -> int | None:
    lowered = dim_name.lower()
    if any(word in lowered for word in _BATCH_NAMES) or lowered in _EXACT_BATCH_NAMES:
        return batch_size
    if any(word in lowered for word in _SEQ_NAMES):
        return seq_len
    if axis == 0:
        return batch_size
    return None


def _static_batch(model: Any) -> int | None:
    """The batch a model whose input shapes are all fixed was exported at: its inputs' shared first dimension (None
    when some input dimension is symbolic, so the batch can be set, or the inputs do not share one)."""
    initializers = {init.name for init in model.graph.initializer}
    leading = set()
    for value in model.graph.input:
        if value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        dims = value.type.tensor_type.shape.dim
        if any(not dim.HasField("dim_value") for dim in dims):
            return None
        if dims:
            leading.add(dims[0].dim_value)
    return leading.pop() if len(leading) == 1 else None


def _fix_symbolic_dims(model: Any, batch_size: int, seq_len: int) -> None:
    """Give every symbolic input/output dimension a value (see the module docstring); drop stale value_info."""
    initializers = {init.name for init in model.graph.initializer}
    for is_input, values in ((True, model.graph.input), (False, model.graph.output)):
        for value in values:
            if value.name in initializers or not value.type.HasField("tensor_type"):
                continue
            for axis, dim in enumerate(value.type.tensor_type.shape.dim):
                if dim.HasField("dim_value"):
                    continue
                size = _dim_value(dim.dim_param, axis, batch_size, seq_len)
                if size is None:
                    if is_input:
                        raise JobLoadError(f"cannot size dimension {dim.dim_param!r} (axis {axis}) of ONNX input "
                                           f"{value.name!r}: name it like batch or sequence, or make it static")
                    dim.Clear()  # an output dimension: let shape inference work it out
                else:
                    dim.dim_value = size
    del model.graph.value_info[:]


def _tensor_meta(value_type: Any) -> TensorMeta | None:
    if not value_type.HasField("tensor_type"):
        return None
    tensor_type = value_type.tensor_type
    dims = tensor_type.shape.dim if tensor_type.HasField("shape") else []
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims)
    return TensorMeta(shape=shape, dtype=_ONNX_DTYPES.get(tensor_type.elem_type, "float32"))


def _attributes(node: Any) -> dict[str, Any]:
    import onnx

    attrs: dict[str, Any] = {}
    for attribute in node.attribute:
        if attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS, onnx.AttributeProto.TENSOR):
            continue
        value = onnx.helper.get_attribute_value(attribute)
        attrs[attribute.name] = value.decode() if isinstance(value, bytes) else value
    return attrs


# ONNX op -> positions of inputs it does not differentiate (their gradient is never computed): running
# statistics, indices, shapes, axes, ... (float operands elsewhere are differentiated when they need a gradient)
NON_DIFFERENTIABLE_INPUTS: dict[str, frozenset[int]] = {
    "BatchNormalization": frozenset({3, 4}),
    "Gather": frozenset({1}), "GatherElements": frozenset({1}), "GatherND": frozenset({1}),
    "Reshape": frozenset({1}), "Expand": frozenset({1}), "Tile": frozenset({1}), "Pad": frozenset({1, 2, 3}),
    "Slice": frozenset({1, 2, 3, 4}), "Squeeze": frozenset({1}), "Unsqueeze": frozenset({1}),
    "Split": frozenset({1}), "ReduceMean": frozenset({1}), "ReduceSum": frozenset({1}),
    "ReduceMax": frozenset({1}), "ReduceMin": frozenset({1}), "Resize": frozenset({1, 2, 3}),
    "Where": frozenset({0}), "Dropout": frozenset({1, 2}), "CastLike": frozenset({1}),
}
# ONNX ops whose outputs never carry a gradient (shape, comparisons and index computations)
NO_GRADIENT_OPS = frozenset({"Shape", "Size", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not",
                             "And", "Or", "Xor", "ArgMax", "ArgMin", "NonZero", "ConstantOfShape", "Range",
                             "IsNaN", "IsInf", "Sign", "Floor", "Ceil", "Round", "Constant"})
# ONNX op -> position of its bias: a bias that is a constant, not a trained parameter, is the exporter's
# stand-in for no bias (torch's `bias=None` exported as a zero tensor): a training graph leaves it out, as it has
# no gradient and torch's graph has no bias there
CONSTANT_BIAS_INPUT: dict[str, int] = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}
# ONNX ops that are views of their input in a PyTorch training step (`transpose`, `permute`, `clone` under
# export): no kernel of their own
TRAINING_VIEWS = frozenset({"Transpose", "Identity"})
# attributes a training step sets on an op exported in inference form
TRAINING_ATTRS: dict[str, dict[str, Any]] = {"BatchNormalization": {"training_mode": 1}}


def _trainable(model: Any) -> frozenset[str]:
    """The trained parameters: float initializers some node differentiates (fed to a differentiable input);
    buffers such as batch norm's running statistics are not."""
    floats = {init.name for init in model.graph.initializer if _ONNX_DTYPES.get(init.data_type) in _FLOAT_NAMES}
    used = {name for node in model.graph.node
            for position, name in enumerate(node.input)
            if name in floats and position not in NON_DIFFERENTIABLE_INPUTS.get(node.op_type, ())}
    return frozenset(used)


_FLOAT_NAMES = frozenset({"float32", "float16", "bfloat16", "float64"})


@dataclass(frozen=True)
class _Linear:
    """A MatMul by a weight (maybe through its Transpose) and the Add of its bias: torch's `linear`."""

    weight: str  # the parameter
    weight_meta: TensorMeta  # in torch's layout, (N, K)
    add: int | None  # index of the bias Add node folded in
    bias: str | None
    output: str  # the value the layer produces (the Add's output when there is a bias)


def _linear_layers(graph: Any, weights: Mapping[str, int], metas: Mapping[str, TensorMeta]) -> dict[int, _Linear]:
    """Node index -> the linear layer it is: a MatMul whose right operand is a 2-D parameter (K, N) or the
    Transpose of one (N, K), with, when its only consumer is an Add of a 1-D parameter of N elements, that Add as
    its bias; or a Gemm by a parameter (`transB` says its layout)."""
    transposed = {n.output[0]: n.input[0] for n in graph.node
                  if n.op_type == "Transpose" and n.input and n.input[0] in weights
                  and len(metas[n.input[0]].shape) == 2
                  and [a.ints for a in n.attribute if a.name == "perm"] in ([], [[1, 0]])}
    consumers: dict[str, list[int]] = {}
    for index, node in enumerate(graph.node):
        for value in node.input:
            consumers.setdefault(value, []).append(index)
    outputs = {v.name for v in graph.output}
    layers: dict[int, _Linear] = {}
    for index, node in enumerate(graph.node):
        if node.op_type == "Gemm" and not node.domain and len(node.input) >= 2 and node.input[1] in weights:
            attrs = {a.name: a.i for a in node.attribute if a.name in ("transA", "transB")}
            k, n = metas[node.input[1]].shape[::-1] if attrs.get("transB") else metas[node.input[1]].shape
            if not attrs.get("transA"):  # Gemm(x, W (K, N) or its transpose, b): weight in torch's layout
                bias = node.input[2] if len(node.input) > 2 and node.input[2] in weights else None
                layers[index] = _Linear(node.input[1], TensorMeta(shape=(n, k), dtype=metas[node.input[1]].dtype),
                                        None, bias, node.output[0])
            continue
        if node.op_type != "MatMul" or node.domain or len(node.input) != 2:
            continue
        right = node.input[1]
        if right in transposed:
            weight, weight_meta = transposed[right], metas[transposed[right]]
        elif right in weights and len(metas[right].shape) == 2:
            k, n = metas[right].shape
            weight, weight_meta = right, TensorMeta(shape=(n, k), dtype=metas[right].dtype)
        else:
            continue
        add = bias = None
        output = node.output[0]
        users = consumers.get(output, [])
        if len(users) == 1 and output not in outputs:
            user = graph.node[users[0]]
            other = [v for v in user.input if v != output]
            if (user.op_type == "Add" and not user.domain and len(other) == 1 and other[0] in weights
                    and metas[other[0]].shape == (weight_meta.shape[0],)):
                add, bias, output = users[0], other[0], user.output[0]
        layers[index] = _Linear(weight, weight_meta, add, bias, output)
    return layers


def _build(model: Any, name: str, trainable: frozenset[str] | None = None) -> Graph:
    """The graph of a shape-inferred model; with `trainable` (the parameter names), a training graph."""
    training = trainable is not None
    graph = model.graph
    metas: dict[str, TensorMeta] = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        meta = _tensor_meta(value.type)
        if meta is not None:
            metas[value.name] = meta
    weights: dict[str, int] = {}  # float initializer name -> elements
    param_elements = param_bytes = 0
    for init in graph.initializer:
        meta = TensorMeta(shape=tuple(init.dims), dtype=_ONNX_DTYPES.get(init.data_type, "float32"))
        metas[init.name] = meta
        if is_float(meta) and (trainable is None or init.name in trainable):
            weights[init.name] = meta.numel
            param_elements += meta.numel
            param_bytes += tensor_bytes(meta)
    initializer_names = {init.name for init in graph.initializer}
    user_inputs = tuple(metas[v.name] for v in graph.input if v.name not in initializer_names and v.name in metas)

    producer: dict[str, str] = {}  # value name -> id of the node producing it
    needs_grad: dict[str, bool] = dict.fromkeys(weights, training)  # value name -> whether it needs a gradient
    # values that are constants, not trained parameters: other initializers and Constant nodes' outputs
    constants = {*(initializer_names - set(weights)),
                 *(o for n in graph.node if n.op_type == "Constant" and not n.domain for o in n.output)}
    data = {v.name for v in graph.input if v.name not in initializer_names}  # values computed from the inputs
    linears = _linear_layers(graph, weights, metas) if training else {}
    folded = {layer.add for layer in linears.values() if layer.add is not None}
    used_ids: set[str] = set()
    nodes: list[Node] = []
    for index, onnx_node in enumerate(graph.node):
        if index in folded:
            continue  # a linear layer's bias Add: part of its MatMul's node
        node_id = onnx_node.name or f"{onnx_node.op_type}_{index}"
        if node_id in used_ids:
            node_id = f"{node_id}_{index}"
        used_ids.add(node_id)
        op = f"onnx::{onnx_node.op_type}"
        kind = kind_of_onnx(onnx_node.op_type, onnx_node.domain)
        input_names, output_names = list(onnx_node.input), list(onnx_node.output)
        from_data = any(i in data for i in input_names)
        if from_data:
            data.update(o for o in output_names if o)
        elif training and kind == OpKind.copy:
            kind = OpKind.view  # a weight's Transpose or Cast: a view of the parameter in a training step
        if training and onnx_node.op_type in TRAINING_VIEWS and from_data:
            kind = OpKind.view
        layer = linears.get(index)
        if layer is not None:  # torch's linear(x, weight (N, K), bias)
            kind = OpKind.linear
            metas[f"{layer.weight}#linear"] = layer.weight_meta
            input_names = [input_names[0], f"{layer.weight}#linear", *([layer.bias] if layer.bias else [])]
            attrs_override = {"transA": 0, "transB": 1}  # a Gemm's operands are now x and W (N, K)
            needs_grad[f"{layer.weight}#linear"] = True
            output_names = [layer.output]
            if from_data:
                data.add(layer.output)
        present = [(position, i) for position, i in enumerate(input_names) if i and i in metas
                   and not (training and position == CONSTANT_BIAS_INPUT.get(onnx_node.op_type)
                            and i in constants)]
        inputs = tuple(metas[i] for _, i in present)
        outputs = tuple(metas[o] for o in output_names if o and o in metas)
        attrs = _attributes(onnx_node)
        if layer is not None:
            attrs.update(attrs_override)
        grad_inputs = None
        if training:
            skip = NON_DIFFERENTIABLE_INPUTS.get(onnx_node.op_type, frozenset())
            grad_inputs = tuple(needs_grad.get(i, False) and position not in skip for position, i in present)
            attrs.update(TRAINING_ATTRS.get(onnx_node.op_type, {}))
            differentiable = (any(grad_inputs) and any(is_float(t) for t in outputs)
                              and onnx_node.op_type not in NO_GRADIENT_OPS)
            for output in output_names:
                if output:
                    needs_grad[output] = differentiable and output in metas and is_float(metas[output])
            if not differentiable:
                grad_inputs = None
        call = OpCall(inputs=inputs, outputs=outputs, attrs=attrs, grad_inputs=grad_inputs)
        cost = op_cost(op, call, kind)
        nodes.append(Node(
            id=node_id, op=op, kind=kind,
            inputs=tuple(dict.fromkeys(producer[i] for i in onnx_node.input if i in producer)),
            input_tensors=inputs, output_tensors=outputs,
            flops_fwd=cost.flops_fwd, flops_bwd=cost.flops_bwd,
            bytes_read_fwd=cost.bytes_read_fwd, bytes_written_fwd=cost.bytes_written_fwd,
            bytes_read_bwd=cost.bytes_read_bwd, bytes_written_bwd=cost.bytes_written_bwd,
            params=sum(weights.get(i.removesuffix("#linear"), 0) for i in dict.fromkeys(input_names)),
            module=onnx_node.name or None, dilation=conv_dilation(call) if kind == OpKind.conv else 1,
            equation=einsum_equation(call),
        ))
        for output in output_names:
            if output:
                producer[output] = node_id
    activation_bytes = sum(sum(tensor_bytes(t) for t in n.output_tensors) for n in nodes if n.kind != OpKind.view)
    totals = GraphTotals.from_nodes(nodes, params=param_elements, param_bytes=param_bytes,
                                    activation_bytes=activation_bytes)
    return Graph(name=name, source="onnx", mode="train" if training else "inference", nodes=tuple(nodes),
                 totals=totals, inputs=user_inputs)

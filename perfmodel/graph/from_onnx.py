"""The graph of an ONNX model: one Node per ONNX node, shapes from ONNX shape inference, costs from the same
FLOP table as PyTorch graphs (`perfmodel.graph.flops`). ONNX graphs are inference graphs (no backward costs).

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

from pathlib import Path
from typing import Any

from perfmodel.errors import JobLoadError
from perfmodel.graph.flops import OpCall, is_float, op_cost, tensor_bytes
from perfmodel.graph.ir import Graph, GraphTotals, Node, TensorMeta
from perfmodel.graph.opkinds import OpKind, kind_of_onnx
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
                    name: str | None = None) -> Graph:
    """Load, check and shape-infer an ONNX file and build its (inference) graph. Any problem with the file itself
    (missing, truncated, not ONNX, fails the checker) raises a one-line JobLoadError (a PerfmodelError)."""
    import onnx

    path = Path(path)
    model = _load_checked(path)
    _fix_symbolic_dims(model, batch_size or 1, seq_len or DEFAULT_SEQ_LEN)
    try:
        if model.functions:
            import onnx.inliner

            model = onnx.inliner.inline_local_functions(model)
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # inference errors come from C++ with long messages: keep the first line
        raise JobLoadError(f"ONNX shape inference failed for {path}: {_first_line(exc)}") from None
    return _build(model, name=name or path.stem)


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


def _build(model: Any, name: str) -> Graph:
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
        if is_float(meta):
            weights[init.name] = meta.numel
            param_elements += meta.numel
            param_bytes += tensor_bytes(meta)
    initializer_names = {init.name for init in graph.initializer}
    user_inputs = tuple(metas[v.name] for v in graph.input if v.name not in initializer_names and v.name in metas)

    producer: dict[str, str] = {}  # value name -> id of the node producing it
    used_ids: set[str] = set()
    nodes: list[Node] = []
    for index, onnx_node in enumerate(graph.node):
        node_id = onnx_node.name or f"{onnx_node.op_type}_{index}"
        if node_id in used_ids:
            node_id = f"{node_id}_{index}"
        used_ids.add(node_id)
        op = f"onnx::{onnx_node.op_type}"
        kind = kind_of_onnx(onnx_node.op_type, onnx_node.domain)
        inputs = tuple(metas[i] for i in onnx_node.input if i and i in metas)
        outputs = tuple(metas[o] for o in onnx_node.output if o and o in metas)
        cost = op_cost(op, OpCall(inputs=inputs, outputs=outputs, attrs=_attributes(onnx_node)), kind)
        nodes.append(Node(
            id=node_id, op=op, kind=kind,
            inputs=tuple(dict.fromkeys(producer[i] for i in onnx_node.input if i in producer)),
            input_tensors=inputs, output_tensors=outputs,
            flops_fwd=cost.flops_fwd, bytes_read_fwd=cost.bytes_read_fwd, bytes_written_fwd=cost.bytes_written_fwd,
            params=sum(weights.get(i, 0) for i in dict.fromkeys(onnx_node.input)),
            module=onnx_node.name or None,
        ))
        for output in onnx_node.output:
            if output:
                producer[output] = node_id
    activation_bytes = sum(sum(tensor_bytes(t) for t in n.output_tensors) for n in nodes if n.kind != OpKind.view)
    totals = GraphTotals.from_nodes(nodes, params=param_elements, param_bytes=param_bytes,
                                    activation_bytes=activation_bytes)
    return Graph(name=name, source="onnx", mode="inference", nodes=tuple(nodes), totals=totals, inputs=user_inputs)
